"""streaming: attention sinks + a recent window (StreamingLLM).

Xiao et al., "Efficient Streaming Language Models with Attention Sinks", ICLR 2024.
The first few tokens receive a large share of attention whatever their content; keeping
them (``n_sink``) stabilises a sliding window.
"""

from __future__ import annotations

import torch

from .base import CacheView, Param, Policy
from .registry import register


@register
class StreamingLLM(Policy):
    """Keep positions ``< n_sink`` (forced) plus the newest ``budget - n_sink``; score = position.

    Where ThinkViz departs from the paper: StreamingLLM caches keys before the rotary embedding
    and numbers positions *within the cache*, so a stream can run past the model's context.
    ThinkViz caches keys rotated at their original positions, as every other policy here does:
    the comparison then isolates which tokens are kept, and the shipped traces stay within the
    model's context, where the two give the same attention up to the rotation of the gaps.
    Protected spans are kept as well unless the protection toggles are off."""

    name = "streaming"
    score_scale = None  # position order only: nothing graded
    summary = "Keep the first few 'sink' tokens forever, plus a sliding window of the newest ones."
    source = "StreamingLLM — Xiao et al., ICLR 2024 (arXiv:2309.17453)"
    params = (Param("n_sink", 4, 0, 64, 1, "attention-sink tokens kept at the start"),)
    reads_attention = False

    def score(self, view: CacheView) -> torch.Tensor:
        return view.positions.float()
