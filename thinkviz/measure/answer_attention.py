"""How much attention the answer pays each earlier token, measured in one eager forward.

The quantity DynTS's importance predictor learns to predict, and what the app's "attention from the
answer" heat shows.  :func:`attention_maps` runs token ids through the model (chunks of
:data:`CHUNK` queries over a KV cache, so one chunk's attention exists at a time) while a hook
on every layer's ``self_attn`` adds that layer's attention, averaged over query heads, into one
``(N, N)`` map; it also returns the hidden states of chosen layers.  The full cache is used:
nothing is evicted, so this is what the answer attends to when it can see every token.

:mod:`thinkviz.core.attention`'s hooks reduce per kv-head for the engine's incremental steps; this
needs the whole query × key map once, so it sums its own.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from ..core.attention import attention_modules
from ..core.events import RunRecord
from ..models.loading import LoadedModel

CHUNK = 1024  # queries per forward: bounds one layer's attention map to (heads, CHUNK, N)


def attention_maps(
    loaded: LoadedModel, ids: Sequence[int], layers: Sequence[int] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, N)`` attention from each query (row) to each key (column), mean over layers and
    query heads, and ``(N, k, d)`` hidden states of ``layers`` (indices into the model's
    ``hidden_states``: ``0`` the embeddings, ``-1`` the final norm's output)."""
    tokens = torch.tensor([list(ids)], device=loaded.device)
    total = tokens.shape[1]
    summed = torch.zeros(total, total)
    hidden: list[torch.Tensor] = []
    start = 0

    def add(module, args, output) -> None:
        weights = output[1][0].float().mean(0).cpu()  # (q, T)
        summed[start : start + weights.shape[0], : weights.shape[1]] += weights

    handles = [m.register_forward_hook(add) for m in attention_modules(loaded.model)]
    cache = DynamicCache()
    try:
        with torch.inference_mode():
            for start in range(0, total, CHUNK):
                out = loaded.model(
                    tokens[:, start : start + CHUNK], cache=cache, use_cache=True, output_hidden_states=bool(layers)
                )
                if layers:
                    hidden.append(torch.stack([out.hidden_states[i][0].float().cpu() for i in layers], dim=1))
    finally:
        for handle in handles:
            handle.remove()
    size = loaded.model.config.get_text_config().hidden_size
    features = torch.cat(hidden) if hidden else torch.zeros(total, 0, size)
    return summed / len(handles), features


def from_answer(maps: torch.Tensor, answer_start: int) -> torch.Tensor:
    """``(answer_start,)`` attention each earlier token receives from the answer: mean over the
    answer's queries (the rows from ``answer_start`` on) of ``maps``."""
    return maps[answer_start:, :answer_start].mean(0)


def answer_start(spans: Sequence[Any]) -> int | None:
    """Where the answer begins in a run's segments: the end of its last closed think block
    (``None`` without one)."""
    ends = [_field(s, "end") for s in spans if _field(s, "kind") == "think" and _field(s, "closed")]
    return max(ends) if ends else None


def _field(span: Any, name: str) -> Any:
    return span.get(name) if isinstance(span, dict) else getattr(span, name)


def attention_from_answer(loaded: LoadedModel, ids: Sequence[int], spans: Sequence[Any]) -> list[float] | None:
    """Attention from the answer for every token before it, for a run's ``ids`` and segment
    ``spans``; ``None`` when the run has no answer after a closed think block."""
    start = answer_start(spans)
    if start is None or start >= len(ids):
        return None
    maps, _ = attention_maps(loaded, ids)
    return from_answer(maps, start).tolist()


def attach_answer_attention(loaded: LoadedModel, record: RunRecord) -> bool:
    """Measure the attention from the answer of a finished run and keep it in
    ``record.summary["answer_attention"]`` (one number per token before the answer, saved with
    the recording); ``False`` when the run has no answer after a closed think block."""
    ids = list(record.prompt_ids) + [t for event in record.events for t in event.token_ids]
    paid = attention_from_answer(loaded, ids, record.segments)
    if paid is None:
        return False
    record.summary["answer_attention"] = paid
    return True
