"""h2o: Heavy-Hitter Oracle — accumulated attention received, plus a recent window.

Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
Language Models", NeurIPS 2023 (arXiv:2306.14048).
"""

from __future__ import annotations

import torch

from .base import CacheView, Param, Policy, ScoreScale
from .registry import register


@register
class HeavyHitters(Policy):
    """Score ``(L, H_kv, T)`` = attention received ÷ number of queries that could see the slot.

    Normalising by the number of queries removes the bias towards old tokens that raw
    accumulated attention has (old tokens have simply been looked at more often).
    The newest ``recent`` tokens are always kept.
    """

    name = "h2o"
    score_scale = ScoreScale(
        "attention received per query since the token was written",
        "rarely attended",
        "heavy hitter: attended most",
    )
    summary = "Keep the 'heavy hitters' — tokens that received the most attention so far — plus the newest tokens."
    source = "H2O — Zhang et al., NeurIPS 2023 (arXiv:2306.14048)"
    params = (Param("recent", 32, 0, 1024, 1, "newest tokens always kept"),)

    def score(self, view: CacheView) -> torch.Tensor:
        return view.received / view.queries_seen
