"""Repeat-prefill: the reference queries of attention matching's paper (Zweiger, Fu, Guo, Kim, "Fast
KV Compaction via Attention Matching", arXiv:2602.16284).

To stand for the queries a compacted context will meet, the paper has the model read the context
again after an instruction to repeat it and takes the queries over that second reading.  Here a
policy asks for a stretch of the text (``CacheView.reread``); the model reads
:data:`REPEAT_INSTRUCTION` and those tokens at the next absolute positions on top of a *copy* of the
cache, as attention reads it (decoded from any KV format, each slot's bias added, a ragged
layout's holes hidden), and the queries of the re-read tokens come back.  The run's own cache,
statistics and position do not change: the copy is thrown away.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .attention import BIASED_ATTENTION, LayerArguments, attention_implementation
from .cache import EvictingCache

REPEAT_INSTRUCTION = "\n\nRepeat the following part of the text above, word for word:\n"


@torch.inference_mode()
def repeat_prefill(
    model: torch.nn.Module, cache: EvictingCache, ids: list[int], start: int, count: int, masks: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read ``ids`` (the instruction, then the ``count`` re-read tokens) at positions ``start …`` on a
    copy of ``cache``, each layer with its additive mask ``masks[l]`` ``(1, 1 or H, q, T_l + q)``.
    Returns the re-read tokens' queries ``(L, H, count, D)`` (scaled, RoPE applied) and the
    positions ``(count,)`` they were read at.  The caller holds the model's forward lock."""
    at = torch.arange(start, start + len(ids))
    copy = DynamicCache(config=model.config)
    for layer in range(len(cache.layers)):
        copy.update(*cache.layer_kv(layer), layer)
    sink: list[torch.Tensor] = []
    arguments = [
        {
            "attention_mask": mask,
            "slot_bias": cache.layer_bias(layer),
            "query_sink": lambda _, query: sink.append(query[0, :, -count:].float()),
        }
        for layer, mask in enumerate(masks)
    ]
    device = model.get_input_embeddings().weight.device
    with attention_implementation(model, BIASED_ATTENTION), LayerArguments(model, arguments):
        model(
            input_ids=torch.tensor([ids], device=device),
            position_ids=at[None].to(device),
            attention_mask=masks[0],
            cache=copy,
            use_cache=True,
            logits_to_keep=1,
        )
    return torch.stack(sink), at[-count:]
