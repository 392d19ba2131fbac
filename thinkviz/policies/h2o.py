"""h2o: Heavy-Hitter Oracle — accumulated attention received, plus a recent window.

Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
Language Models", NeurIPS 2023 (arXiv:2306.14048).  The paper's score is each token's attention
received, summed over every query since it was written (its Algorithm 1); ThinkViz's
``normalize=queries`` is a variant of its own.
"""

from __future__ import annotations

import torch

from .base import CacheView, Param, Policy, ScoreScale
from .registry import register

NORMALIZE = Param(
    "normalize",
    "none",
    choices=("none", "queries"),
    help="none: attention received, summed over every query (H2O's score); queries: divided by the "
    "number of queries that could see the token (a mean per query, which favours young tokens)",
    before="queries",
)


def accumulated_attention(view: CacheView, normalize: str) -> torch.Tensor:
    """``(L, H_kv, T)`` the attention each slot received from every query since it was written
    (``normalize="none"``), or that sum ÷ the number of those queries (``"queries"``)."""
    return view.received if normalize == "none" else view.received / view.queries_seen


@register
class HeavyHitters(Policy):
    """Score ``(L, H_kv, T)`` = attention each slot received, summed over every query since it was
    written; the newest ``recent`` tokens are always kept.

    Where ThinkViz departs from the paper: the sum is over queries *seen while the token was in
    the cache* (an evicted token's score is gone, as in the paper's greedy eviction), averaged
    over the query heads of a kv group (the paper has no grouped-query attention), and the
    prompt is scored by the prefill's attention like any other query.  ``normalize=queries``
    divides by the number of queries that could see the slot: not in the paper; it removes
    old tokens' head start (they have simply been looked at more often) but favours the newest
    tokens outside the window, which have been judged by few queries.  ThinkViz's h2o used this
    mean until issue 36; it stays as a knob so the two can be compared.
    """

    name = "h2o"
    score_scale = ScoreScale(
        "attention received since the token was written (summed, or per query with normalize=queries)",
        "rarely attended",
        "heavy hitter: attended most",
    )
    summary = "Keep the 'heavy hitters' — tokens that received the most attention so far — plus the newest tokens."
    source = "H2O — Zhang et al., NeurIPS 2023 (arXiv:2306.14048)"
    params = (Param("recent", 32, 0, 1024, 1, "newest tokens always kept"), NORMALIZE)

    def score(self, view: CacheView) -> torch.Tensor:
        return accumulated_attention(view, self.normalize)
