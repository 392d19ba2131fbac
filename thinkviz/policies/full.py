"""full: keep every token — the reference every other policy is measured against."""

from __future__ import annotations

import torch

from .base import CacheView, Policy, ScoreScale
from .registry import register

REFERENCE_POLICY = "full"  # what every other policy is measured against (fidelity, sweeps, Compare)


@register
class FullCache(Policy):
    """Never evicts; ``select`` returns every slot ``(L, H_kv, T)``. Importance shown is the
    attention each token received, normalised by how many queries could see it (h2o's
    ``normalize=queries``: a heat to look at, which decides nothing).  No paper: the reference."""

    name = REFERENCE_POLICY
    score_scale = ScoreScale(
        "attention received per query since the token was written (as h2o)",
        "rarely attended",
        "attended most",
    )
    summary = "Keep every token. The cache grows by one entry per token in every layer and head."
    source = "reference (no eviction)"
    evicts = False

    def score(self, view: CacheView) -> torch.Tensor:
        return view.received / view.queries_seen

    def select(self, view: CacheView) -> torch.Tensor:
        layers, heads, total = view.positions.shape
        return torch.arange(total).expand(layers, heads, total)
