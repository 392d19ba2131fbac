"""window: FIFO sliding window — keep only the most recent ``budget`` tokens.

The static baseline that semantic KV-eviction (the ``entropy`` policy) criticises: an early
formula or definition is dropped as soon as it is ``budget`` tokens old, however important it was.
"""

from __future__ import annotations

import torch

from .base import CacheView, Policy
from .registry import register


@register
class SlidingWindow(Policy):
    """Score = absolute position ``(L, H_kv, T)``, so top-``budget`` keeps the newest tokens.

    No paper to depart from: a baseline.  Like every policy here it keeps the protected spans
    (system prompt, question) beyond its window unless the protection toggles are off."""

    name = "window"
    score_scale = None  # position order only: nothing graded
    summary = "First in, first out: keep the newest tokens, drop the oldest, whatever they were."
    source = "FIFO baseline (the static eviction semantic policies are measured against)"
    reads_attention = False

    def score(self, view: CacheView) -> torch.Tensor:
        return view.positions.float()
