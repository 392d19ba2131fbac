"""Replay a fixed reasoning trace through policies and measure fidelity against the full cache.

A *trace* is either a single-turn chat (system prompt + question) with the assistant's text,
or a *transcript*: a whole conversation with tool output and several user and assistant
turns (:mod:`thinkviz.text.transcript`).  Both come from a preset or a UTF-8 file
(:func:`load_trace`).  :func:`prepare` tokenizes one into the prompt the engine prefills and
the ids it teacher-forces: for a single-turn trace the prompt opens the assistant's
``<think>`` turn (:func:`prepare_trace`); for a transcript it ends with the first user turn
and every later token — assistant turns, tool output, later user turns — is teacher-forced,
with every turn's role known up front (:func:`prepare_transcript`).

:class:`LockstepReplay` runs the trace through the full cache and through any number of
policies *in lockstep*, one chunk of ``interval`` tokens at a time.  After each chunk the
full run's next-token distributions are compared with every policy's right away and then
dropped, so the full cache is computed once per trace and memory stays at one chunk of
logits per run (``(interval, V)`` floats) — never ``(trace, V)``.  This is exact (float32
KL) at the price of keeping every run's KV cache alive at once; the alternative, storing the
reference log-softmax, would need ``trace × V`` numbers (4k × 49k × 2 bytes ≈ 400 MB in
float16, and float16 rounding of log-probs is already ~1e-3 nats of KL noise).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from collections.abc import Iterator, Sequence

import torch

from ..text.chat import REASONING_SYSTEM_PROMPT, ChatPrompt, build_chat, build_conversation, split_conversation
from ..core.engine import DecodeSettings, EngineError, Run
from ..core.kvquant import KVQuant
from ..core.together import replay_together
from .metrics import (
    FIDELITY_KINDS,
    TokenFidelity,
    kl_divergence,
    log_probs,
    summarize_by_kind,
    token_nll,
    top1_agreement,
)
from ..models.loading import LoadedModel
from ..policies import REFERENCE_POLICY, Policy, make_policy
from ..demos.presets import PresetError, load_preset
from ..text.transcript import Message, TraceError, is_transcript, join_chat, parse_transcript, read_trace_file

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ASSISTANT_PREFIX = "<think>\n"
DEFAULT_QUESTION = "Think it through step by step."


@dataclass(frozen=True)
class Trace:
    """A chat to replay: ``system`` prompt, user ``question`` and the assistant's ``text``, or,
    for a transcript, the whole conversation in ``messages`` (``system`` / ``question`` are then
    its first system and user messages, and ``text`` is empty)."""

    name: str
    system: str | None
    question: str
    text: str
    messages: tuple[Message, ...] | None = None

    @classmethod
    def of_transcript(cls, name: str, messages: Sequence[Message]) -> Trace:
        system = messages[0].content if messages and messages[0].role == "system" else None
        question = next((m.content for m in messages if m.role == "user"), "")
        return cls(name, system, question, "", tuple(messages))

    @property
    def conversation(self) -> tuple[Message, ...]:
        """Its messages: a transcript's own, or the system prompt, question and assistant text."""
        if self.messages is not None:
            return self.messages
        head = () if self.system is None else (Message("system", self.system),)
        return (*head, Message("user", self.question), Message("assistant", self.text))


def trace_from_text(text: str, system: str | None, question: str, name: str = "pasted") -> Trace:
    """A trace typed, pasted or uploaded in the app: a transcript (one that starts with an
    assistant or tool message continues ``system`` and ``question``) or the assistant's text."""
    if is_transcript(text):
        return Trace.of_transcript(name, join_chat(system, question, parse_transcript(text, continues=True)))
    return Trace(name, system, question, text)


def load_trace(spec: str, question: str | None = None, system: str | None = None) -> Trace:
    """A trace from a preset (a name in ``presets/`` or a ``.yaml`` path) or a file path.

    A file holds the assistant's text, or a transcript (JSON, JSONL or ``ROLE:`` lines, see
    :func:`~thinkviz.text.transcript.is_transcript`).  An assistant-text file's chat is ``system``
    (default: the reasoning prompt) and ``question`` (default: a generic instruction).  A
    preset brings its own system prompt (``null`` there means the reasoning prompt, as in the
    app) and question, a transcript its own messages; ``question`` / ``system`` override them
    when given (in a transcript: its first user message, and its leading system message).
    """
    path = Path(spec)
    is_preset = path.suffix in (".yaml", ".yml") or not (path.suffix or path.exists() or "/" in spec)
    if not is_preset:
        text = read_trace_file(path)
        if is_transcript(text, path.name):
            return _override(Trace.of_transcript(path.stem, parse_transcript(text)), question, system)
        return Trace(
            path.stem, REASONING_SYSTEM_PROMPT if system is None else system, question or DEFAULT_QUESTION, text
        )
    try:
        preset = load_preset(spec)
    except PresetError as exc:
        raise TraceError(str(exc)) from None
    if not preset.trace or not preset.trace.strip():
        raise TraceError(f"preset {spec!r} has no trace to replay")
    if preset.messages is not None:
        return _override(Trace.of_transcript(preset.name, preset.messages), question, system)
    return Trace(
        preset.name, preset.system_prompt if system is None else system, question or preset.question, preset.trace
    )


def _override(trace: Trace, question: str | None, system: str | None) -> Trace:
    """``trace`` with its first user message replaced by ``question`` and its system prompt by
    ``system`` (inserted first when it has none)."""
    messages = list(trace.messages or ())
    if question:
        first = next(k for k, m in enumerate(messages) if m.role == "user")
        messages[first] = Message("user", question)
    if system is not None:
        if messages[0].role == "system":
            messages[0] = Message("system", system)
        else:
            messages.insert(0, Message("system", system))
    return Trace.of_transcript(trace.name, messages) if question or system is not None else trace


def prepare(loaded: LoadedModel, trace: Trace, max_tokens: int | None = None) -> tuple[ChatPrompt, list[int]]:
    """The prompt to prefill and the ids to teacher-force for ``trace``, single-turn or transcript."""
    return tokenize_trace(loaded.tokenizer, loaded.geometry.max_context, trace, max_tokens)


def tokenize_trace(
    tokenizer: PreTrainedTokenizerBase, max_context: int, trace: Trace, max_tokens: int | None = None
) -> tuple[ChatPrompt, list[int]]:
    """:func:`prepare` with a tokenizer and a context length instead of a loaded model (nothing
    here needs the weights): :func:`prepare_trace` or :func:`prepare_transcript`."""
    if trace.messages is not None:
        return _tokenize_transcript(tokenizer, max_context, trace.messages, max_tokens)
    return _tokenize_single_turn(tokenizer, max_context, trace, max_tokens)


def prepare_trace(
    loaded: LoadedModel, system: str | None, question: str, assistant_text: str, max_tokens: int | None = None
) -> tuple[ChatPrompt, list[int]]:
    """The prompt to prefill (chat + opened assistant turn) and the trace ids to teacher-force.

    A trace that starts with ``"<think>\\n"`` gets an assistant turn opened with it (as
    :func:`~thinkviz.text.chat.build_chat` opens one to generate) and continues after it; any other
    trace (an essay, a plain answer) opens the turn bare, so no think block is invented.  The trace is
    tokenized on its own (no special tokens added) and cut to its first ``max_tokens``.  Raises
    :class:`TraceError` when the question or trace is empty or the whole does not fit the
    model's context.
    """
    trace = Trace("trace", system, question, assistant_text)
    return _tokenize_single_turn(loaded.tokenizer, loaded.geometry.max_context, trace, max_tokens)


def prepare_transcript(
    loaded: LoadedModel, messages: Sequence[Message], max_tokens: int | None = None
) -> tuple[ChatPrompt, list[int]]:
    """The prompt to prefill (the chat up to the end of the first user turn) and every later
    token of the conversation, cut to the first ``max_tokens``.

    The prompt's role spans cover the whole conversation (those of later turns marked
    ``ahead``), so the run's segmenter labels each replayed token with its turn.  Raises
    :class:`TraceError` when the chat template cannot render the conversation, when nothing
    follows the first user message, or when the conversation does not fit the model's
    context (naming the first message that does not).
    """
    return _tokenize_transcript(loaded.tokenizer, loaded.geometry.max_context, messages, max_tokens)


def _tokenize_single_turn(
    tokenizer: PreTrainedTokenizerBase, context: int, trace: Trace, max_tokens: int | None
) -> tuple[ChatPrompt, list[int]]:
    if not trace.question.strip():
        raise TraceError("the question is empty")
    text = trace.text
    thinking = text.startswith(ASSISTANT_PREFIX)  # open the turn with <think> only when the trace does
    body = text[len(ASSISTANT_PREFIX) :] if thinking else text
    if not body.strip():
        raise TraceError("the trace is empty")
    prompt = build_chat(tokenizer, trace.system, trace.question, assistant=ASSISTANT_PREFIX if thinking else "")
    ids = list(tokenizer(body, add_special_tokens=False)["input_ids"])[:max_tokens]
    total = len(prompt.ids) + len(ids)
    if total > context:
        raise TraceError(
            f"prompt + trace is {total} tokens ({len(prompt.ids)} + {len(ids)}); the model's context is {context}"
        )
    return prompt, ids


def _tokenize_transcript(
    tokenizer: PreTrainedTokenizerBase, context: int, messages: Sequence[Message], max_tokens: int | None
) -> tuple[ChatPrompt, list[int]]:
    first_user = next((k for k, m in enumerate(messages) if m.role == "user"), None)
    if first_user is None:
        raise TraceError("the transcript has no user message")
    if first_user == len(messages) - 1:
        raise TraceError("the transcript has nothing after its first user message to replay")
    try:
        chat = build_conversation(tokenizer, messages)
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    cut = chat.roles[first_user].end
    stop = len(chat.ids) if max_tokens is None else min(len(chat.ids), cut + max_tokens)
    if stop > context:
        k, role = next((k, r) for k, r in enumerate(chat.roles) if r.end > context)
        raise TraceError(
            f"the conversation is {stop:,} tokens and the model's context is {context:,}: message {k + 1} "
            f"({role.role}) ends at token {role.end:,}; replay fewer tokens or shorten the transcript"
        )
    return split_conversation(chat, cut, stop)


class LockstepReplay:
    """One trace through the full cache and through ``policies``, chunk by chunk, side by side.

    Every policy must share one ``interval`` (the chunk size); the full-cache reference runs
    with the same chunks.  Iterate to drive it: each step yields the number of trace tokens
    replayed so far.  Afterwards ``reference`` / ``runs`` hold the finished
    :class:`~thinkviz.core.engine.Run` objects; ``kv_quants`` (aligned with ``policies``, default
    full precision) gives each policy run its KV format, while the reference is always the
    full-precision full cache.  Every event of every record carries
    ``info["fidelity"]`` (``nll``, ``nll_full``, ``kl``, ``top1`` lists aligned with the
    event's positions) and ``record.summary["fidelity"]`` holds the means overall and per
    segment kind.  Setting ``cancel`` stops every run after the same chunk.  ``batched``: the runs
    advance as the rows of one forward pass where they can (:mod:`thinkviz.core.together`; each row
    computes what it computes alone), else each with its own.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        policies: Sequence[Policy],
        prompt: ChatPrompt | Sequence[int],
        trace_ids: Sequence[int],
        settings: DecodeSettings = DecodeSettings(scoring=False),
        cancel: threading.Event | None = None,
        kv_quants: Sequence[KVQuant] | None = None,
        batched: bool = True,
    ) -> None:
        self.batched = batched
        kv_quants = list(kv_quants) if kv_quants is not None else [KVQuant()] * len(policies)
        if len(kv_quants) != len(policies):
            raise EngineError(f"{len(policies)} policies but {len(kv_quants)} KV formats")
        intervals = {p.interval for p in policies}
        if len(intervals) > 1:
            raise EngineError(f"policies replayed in lockstep must share one interval, got {sorted(intervals)}")
        interval = intervals.pop() if intervals else 1
        self.cancel = cancel or threading.Event()
        self._stop = threading.Event()  # set only between chunks, so every run stops at the same one
        self.trace_ids = [int(i) for i in trace_ids]
        self.reference = Run(loaded, make_policy(REFERENCE_POLICY, interval=interval), prompt, settings, self._stop)
        self.runs = [Run(loaded, policy, prompt, settings, self._stop, kv) for policy, kv in zip(policies, kv_quants)]
        self.prompt_tokens = len(self.reference.ids)
        self.targets = torch.tensor(self.reference.ids + self.trace_ids)  # (N,) the true sequence
        self.reference_fidelity = TokenFidelity.empty()
        self.fidelity = [TokenFidelity.empty() for _ in policies]

    def __iter__(self) -> Iterator[int]:
        everyone = [self.reference, *self.runs]
        pending: list[list[tuple[list[int], torch.Tensor]]] = [[] for _ in everyone]
        sinks = [lambda positions, logits, box=box: box.append((positions, logits)) for box in pending]
        steps = replay_together(everyone, self.trace_ids, sinks, batched=self.batched)
        while True:
            if self.cancel.is_set():
                self._stop.set()
            events = next(steps, None)
            if events is None:
                break
            if any(event is None for event in events):
                raise RuntimeError("lockstep runs fell out of step")
            self._compare(pending)
            yield events[0].positions[-1] + 1 - self.prompt_tokens
        self._attach()

    def run(self) -> LockstepReplay:
        """Drive the replay to the end; returns ``self``."""
        for _ in self:
            pass
        return self

    def _compare(self, pending: list[list[tuple[list[int], torch.Tensor]]]) -> None:
        """Score every policy's pending chunks against the reference's, then drop them."""
        for index, (positions, reference_logits) in enumerate(pending[0]):
            rows = [i for i, p in enumerate(positions) if p + 1 < len(self.targets)]
            if not rows:
                continue
            predicted = [positions[i] + 1 for i in rows]  # (q,) positions of the tokens predicted
            targets = self.targets[predicted]
            reference = log_probs(reference_logits[rows])  # (q, V)
            nll_full = token_nll(reference, targets)
            agree = torch.ones(len(rows), dtype=torch.bool)
            self.reference_fidelity.extend(predicted, nll_full, nll_full, torch.zeros(len(rows)), agree)
            for box, fidelity in zip(pending[1:], self.fidelity):
                policy_positions, policy_logits = box[index]
                assert policy_positions == positions, "lockstep runs must see the same chunks"
                policy = log_probs(policy_logits[rows])  # (q, V)
                fidelity.extend(
                    predicted,
                    token_nll(policy, targets),
                    nll_full,
                    kl_divergence(reference, policy),
                    top1_agreement(reference, policy),
                )
        for box in pending:
            box.clear()

    def _attach(self) -> None:
        """Per-event fidelity lists and per-run summaries, into the records."""
        for run, fidelity in zip([self.reference, *self.runs], [self.reference_fidelity, *self.fidelity]):
            start = self.prompt_tokens
            for event in run.record.events:
                lo, hi = event.positions[0] - start, event.positions[-1] + 1 - start
                event.info["fidelity"] = {
                    "nll": fidelity.nll[lo:hi].tolist(),
                    "nll_full": fidelity.nll_full[lo:hi].tolist(),
                    "kl": fidelity.kl[lo:hi].tolist(),
                    "top1": fidelity.top1[lo:hi].tolist(),
                }
            # a cancelled run has also predicted the token after its last chunk; count only its own
            replayed = run.processed - start
            run.record.summary["fidelity"] = summarize_by_kind(
                fidelity.first(replayed), run.record.segments, FIDELITY_KINDS
            )
