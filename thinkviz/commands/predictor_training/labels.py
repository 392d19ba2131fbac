"""Label a reasoning trace for the DynTS predictor: what the answer attended to, and what the
baselines knew before it.

A trace is the assistant's text: thinking, the last ``</think>``, then the answer (a
transcript: a whole conversation, whose answer is everything after its last ``</think>``).  It is
teacher-forced under the same chat the app replays it with (:func:`thinkviz.text.chat.build_chat`,
assistant turn opened with ``<think>\\n``) through :func:`thinkviz.measure.answer_attention.attention_maps`
(one eager forward, full cache).  For the ``n`` positions before the answer:

- ``labels``: attention each position receives from the answer tokens, mean over answer
  queries, layers and heads (the quantity DynTS learns);
- ``attention_so_far``: attention received per query from the positions before the answer —
  the dynts fallback's (and h2o's) score when the answer begins;
- ``h2o_at_selection``: the same score when the token first leaves a ``recent``-token local
  window — what h2o knows the first time it has to decide about the token.

Features are the hidden states of the ``layers`` the predictor reads (``-1``: the final norm's
output, which is what the engine hands to dynts).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from collections.abc import Sequence

import torch

from ...measure.answer_attention import attention_maps, from_answer
from ...text.chat import anchor, build_chat, build_conversation, token_boundary
from ...models.loading import LoadedModel
from ...measure.replay import ASSISTANT_PREFIX, Trace
from ...text.transcript import Message

RECENT = 32  # h2o's default local window: a token is first judged when it leaves it


@dataclass
class Examples:
    """One labelled trace, positions ``0 .. n-1`` (everything before the answer).

    ``features`` ``(n, k, d)``: hidden states of ``k`` layers; ``labels``,
    ``attention_so_far``, ``h2o_at_selection`` ``(n,)`` (module docstring); ``thinking``
    ``(n,)`` bool marks the assistant's positions, the tokens DynTS ranks.
    """

    name: str
    features: torch.Tensor
    labels: torch.Tensor
    thinking: torch.Tensor
    attention_so_far: torch.Tensor
    h2o_at_selection: torch.Tensor


def split_answer(trace: str) -> tuple[str, str]:
    """``(thinking up to and including the last </think>, answer)``; ``ValueError`` without one."""
    cut = trace.rfind("</think>")
    if cut < 0:
        raise ValueError("the trace has no </think>: it has no answer to label with")
    cut += len("</think>")
    if not trace[cut:].strip():
        raise ValueError("the trace has nothing after its last </think>")
    return trace[:cut], trace[cut:]


def check_answered(trace: Trace) -> None:
    """``ValueError`` unless ``trace`` has what labelling needs, checked without a model: an
    assistant turn that closes its thinking with ``</think>``, and something after the last one
    (the answer, or a transcript's later turns)."""
    if trace.messages is None:
        split_answer(trace.text.removeprefix(ASSISTANT_PREFIX))
        return
    turns = trace.messages
    closing = [k for k, m in enumerate(turns) if m.role == "assistant" and "</think>" in m.content]
    if not closing:
        raise ValueError("the transcript has no </think> in an assistant turn: it has no answer to label with")
    after = turns[closing[-1]].content.rsplit("</think>", 1)[1] + "".join(m.content for m in turns[closing[-1] + 1 :])
    if not after.strip():
        raise ValueError("the transcript has nothing after its last </think>")


def label_trace(
    loaded: LoadedModel,
    name: str,
    system: str | None,
    question: str,
    trace: str,
    layers: Sequence[int] = (-1,),
    recent: int = RECENT,
) -> Examples:
    """Label ``trace`` (the assistant's text, with or without the opening ``<think>\\n``)."""
    thinking_text, answer_text = split_answer(trace.removeprefix(ASSISTANT_PREFIX))
    prompt = build_chat(loaded.tokenizer, system, question, assistant=ASSISTANT_PREFIX + thinking_text)
    answer = loaded.tokenizer(answer_text, add_special_tokens=False)["input_ids"]
    thinking = torch.zeros(len(prompt.ids), dtype=torch.bool)
    thinking[prompt.roles[-1].start :] = True
    return _examples(loaded, name, prompt.ids + answer, thinking, layers, recent)


def label_transcript(
    loaded: LoadedModel, name: str, messages: Sequence[Message], layers: Sequence[int] = (-1,), recent: int = RECENT
) -> Examples:
    """Label a transcript: the answer is everything after its last ``</think>`` (the last answer,
    and any tool and later turns); the assistant turns before it are the thinking positions."""
    check_answered(Trace.of_transcript(name, messages))
    chat = build_conversation(loaded.tokenizer, messages)
    starts = [0, *itertools.accumulate(map(len, chat.texts))]
    closing = [r for r in chat.roles if r.role == "assistant" and "</think>" in "".join(chat.texts[r.start : r.end])]
    last = closing[-1]  # check_answered found one, and text after it
    close = starts[last.start] + "".join(chat.texts[last.start : last.end]).rfind("</think>")
    cut = token_boundary([anchor(p, a) for p, a in zip(chat.texts, starts)], close + len("</think>"))
    thinking = torch.zeros(cut, dtype=torch.bool)
    for role in chat.roles:
        if role.role == "assistant":
            thinking[role.start : min(role.end, cut)] = True
    return _examples(loaded, name, chat.ids, thinking, layers, recent)


def _examples(
    loaded: LoadedModel, name: str, ids: Sequence[int], thinking: torch.Tensor, layers: Sequence[int], recent: int
) -> Examples:
    """The examples of positions ``0 .. n-1`` (``n = len(thinking)``) of ``ids``, whose rest is the answer."""
    n = len(thinking)
    maps, features = attention_maps(loaded, ids, layers)
    before = maps[:n, :n]
    seen = n - torch.arange(n)  # queries before the answer that could see each position
    window = (torch.arange(n) + recent).clamp(max=n) - 1  # last query of each token's local window
    in_window = before.cumsum(0).gather(0, window[None])[0]
    return Examples(
        name=name,
        features=features[:n],
        labels=from_answer(maps, n),
        thinking=thinking,
        attention_so_far=before.sum(0) / seen,
        h2o_at_selection=in_window / seen.clamp(max=recent),
    )
