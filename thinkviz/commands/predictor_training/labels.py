"""Label a reasoning trace for the DynTS predictor: what the answer attended to, and what the
baselines knew before it.

A trace is the assistant's text: thinking, the last ``</think>``, then the answer.  It is
teacher-forced under the same chat the app replays it with (:func:`thinkviz.chat.build_chat`,
assistant turn opened with ``<think>\\n``), in one eager forward (chunked for long traces,
with a KV cache, so the attention of one chunk exists at a time).  A hook on every layer's
``self_attn`` adds that layer's attention map, averaged over query heads, into one
``(N, N)`` sum; from it, for the ``n`` positions before the answer:

- ``labels``: attention each position receives from the answer tokens, mean over answer
  queries, layers and heads (the quantity DynTS learns);
- ``attention_so_far``: attention received per query from the positions before the answer —
  the dynts fallback's (and h2o's) score when the answer begins;
- ``h2o_at_selection``: the same score when the token first leaves a ``recent``-token local
  window — what h2o knows the first time it has to decide about the token.

Features are the hidden states of the ``layers`` the predictor reads (indices into the
model's ``hidden_states``: ``0`` the embeddings, ``-1`` the final norm's output, which is
what the engine hands to dynts).  :mod:`thinkviz.attention`'s hooks reduce per kv-head for
the engine's incremental steps; this needs the whole query × key map once, so it sums its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from transformers import DynamicCache

from ...attention import attention_modules
from ...chat import build_chat
from ...model import LoadedModel
from ...replay import ASSISTANT_PREFIX

CHUNK = 1024  # queries per forward: bounds one layer's attention map to (heads, CHUNK, N)
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
    ids = torch.tensor([prompt.ids + answer], device=loaded.device)
    n, total = len(prompt.ids), ids.shape[1]
    summed = torch.zeros(total, total)  # (queries, keys): sum over layers of the head-mean map
    hidden: list[list[torch.Tensor]] = []

    def add(module, args, output) -> None:
        weights = output[1][0].float().mean(0).cpu()  # (q, T)
        summed[start : start + weights.shape[0], : weights.shape[1]] += weights

    handles = [m.register_forward_hook(add) for m in attention_modules(loaded.model)]
    cache = DynamicCache()
    try:
        with torch.inference_mode():
            for start in range(0, total, CHUNK):
                out = loaded.model(ids[:, start : start + CHUNK], cache=cache, use_cache=True,
                                   output_hidden_states=True)
                hidden.append([out.hidden_states[i][0].float().cpu() for i in layers])
    finally:
        for handle in handles:
            handle.remove()
    maps = summed / len(handles)  # (N, N) mean over layers and heads
    before = maps[:n, :n]
    seen = n - torch.arange(n)  # queries before the answer that could see each position
    window = (torch.arange(n) + recent).clamp(max=n) - 1  # last query of each token's local window
    in_window = before.cumsum(0).gather(0, window[None])[0]
    features = torch.cat([torch.stack(chunk, dim=1) for chunk in hidden])[:n]  # (n, k, d)
    thinking = torch.zeros(n, dtype=torch.bool)
    thinking[prompt.roles[-1].start :] = True
    return Examples(
        name=name,
        features=features,
        labels=maps[n:, :n].sum(0) / len(answer),
        thinking=thinking,
        attention_so_far=before.sum(0) / seen,
        h2o_at_selection=in_window / seen.clamp(max=recent),
    )
