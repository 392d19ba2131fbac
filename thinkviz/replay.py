"""Replay a fixed reasoning trace through policies and measure fidelity against the full cache.

A *trace* is a chat (system prompt + question) and the assistant's text, taken from a preset
or a UTF-8 file.  :func:`prepare_trace` tokenizes it into the prompt the engine prefills and
the ids it teacher-forces.

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
from typing import Iterator, Sequence

import torch

from .chat import REASONING_SYSTEM_PROMPT, ChatPrompt, build_chat
from .engine import DecodeSettings, EngineError, Run
from .kvquant import KVQuant
from .metrics import (
    TokenFidelity,
    kl_divergence,
    log_probs,
    summarize_by_kind,
    token_nll,
    top1_agreement,
)
from .model import LoadedModel
from .policies import REFERENCE_POLICY, Policy, make_policy
from .presets import PresetError, load_preset

ASSISTANT_PREFIX = "<think>\n"
DEFAULT_QUESTION = "Think it through step by step."
MAX_TRACE_FILE_BYTES = 4 * 1024 * 1024


class TraceError(ValueError):
    """A trace cannot be replayed (empty, not UTF-8 text, too long); the message says why."""


@dataclass(frozen=True)
class Trace:
    """A chat to replay: ``system`` prompt, user ``question`` and the assistant's ``text``."""

    name: str
    system: str | None
    question: str
    text: str


def read_trace_file(path: str | Path) -> str:
    """The text of a UTF-8 trace file; :class:`TraceError` for missing, binary, non-UTF-8 or empty files."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace file {path} does not exist")
    if path.stat().st_size > MAX_TRACE_FILE_BYTES:
        raise TraceError(f"trace file {path} is larger than {MAX_TRACE_FILE_BYTES // 2**20} MiB")
    data = path.read_bytes()
    if b"\x00" in data:
        raise TraceError(f"trace file {path} is binary (it contains NUL bytes), not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"trace file {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8"
        ) from None
    if not text.strip():
        raise TraceError(f"trace file {path} is empty")
    return text


def load_trace(spec: str, question: str | None = None, system: str | None = None) -> Trace:
    """A trace from a preset (a name in ``presets/`` or a ``.yaml`` path) or a text file path.

    A file holds only the assistant's text; its chat is ``system`` (default: the reasoning
    prompt) and ``question`` (default: a generic instruction).  A preset brings its own
    system prompt (``null`` there means the reasoning prompt, as in the app) and question;
    ``question`` / ``system`` override them when given.
    """
    path = Path(spec)
    is_preset = path.suffix in (".yaml", ".yml") or not (path.suffix or path.exists() or "/" in spec)
    if not is_preset:
        text = read_trace_file(path)
        return Trace(path.stem, REASONING_SYSTEM_PROMPT if system is None else system,
                     question or DEFAULT_QUESTION, text)
    try:
        preset = load_preset(spec)
    except PresetError as exc:
        raise TraceError(str(exc)) from None
    if not preset.trace or not preset.trace.strip():
        raise TraceError(f"preset {spec!r} has no trace to replay")
    return Trace(preset.name, preset.system_prompt if system is None else system,
                 question or preset.question, preset.trace)


def prepare_trace(
    loaded: LoadedModel, system: str | None, question: str, assistant_text: str, max_tokens: int | None = None
) -> tuple[ChatPrompt, list[int]]:
    """The prompt to prefill (chat + opened ``<think>`` turn) and the trace ids to teacher-force.

    :func:`~thinkviz.chat.build_chat` already opens the assistant turn with ``"<think>\\n"``, so
    a trace that starts with it continues after it instead of repeating it.  The trace is
    tokenized on its own (no special tokens added) and cut to its first ``max_tokens``.  Raises
    :class:`TraceError` when the question or trace is empty or the whole does not fit the
    model's context.
    """
    if not question.strip():
        raise TraceError("the question is empty")
    body = assistant_text[len(ASSISTANT_PREFIX):] if assistant_text.startswith(ASSISTANT_PREFIX) else assistant_text
    if not body.strip():
        raise TraceError("the trace is empty")
    prompt = build_chat(loaded.tokenizer, system, question, assistant=ASSISTANT_PREFIX)
    ids = list(loaded.tokenizer(body, add_special_tokens=False)["input_ids"])[:max_tokens]
    total, context = len(prompt.ids) + len(ids), loaded.geometry.max_context
    if total > context:
        raise TraceError(
            f"prompt + trace is {total} tokens ({len(prompt.ids)} + {len(ids)}); "
            f"the model's context is {context}"
        )
    return prompt, ids


class LockstepReplay:
    """One trace through the full cache and through ``policies``, chunk by chunk, side by side.

    Every policy must share one ``interval`` (the chunk size); the full-cache reference runs
    with the same chunks.  Iterate to drive it: each step yields the number of trace tokens
    replayed so far.  Afterwards ``reference`` / ``runs`` hold the finished
    :class:`~thinkviz.engine.Run` objects; ``kv_quants`` (aligned with ``policies``, default
    full precision) gives each policy run its KV format, while the reference is always the
    full-precision full cache.  Every event of every record carries
    ``info["fidelity"]`` (``nll``, ``nll_full``, ``kl``, ``top1`` lists aligned with the
    event's positions) and ``record.summary["fidelity"]`` holds the means overall and per
    segment kind.  Setting ``cancel`` stops every run after the same chunk.
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
    ) -> None:
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
        streams = [
            run.replay(self.trace_ids, on_logits=lambda positions, logits, box=box: box.append((positions, logits)))
            for run, box in zip(everyone, pending)
        ]
        while True:
            if self.cancel.is_set():
                self._stop.set()
            events = [next(stream, None) for stream in streams]
            if all(event is None for event in events):
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
                fidelity.extend(predicted, token_nll(policy, targets), nll_full,
                                kl_divergence(reference, policy), top1_agreement(reference, policy))
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
            run.record.summary["fidelity"] = summarize_by_kind(fidelity.first(replayed), run.record.segments)
