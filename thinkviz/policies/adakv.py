"""adakv: one layer's budget shared out over its kv-heads by ranking all heads' scores together.

Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for
Efficient LLM Inference", 2024 (arXiv:2407.11550).  Some heads attend to a few tokens, others
to many; one budget per head wastes memory on the first kind and starves the second.  Ranking
the scores of every head of a layer together gives each head as many slots as its share of
the layer's top scores.
"""

from __future__ import annotations

import torch

from .base import CacheView, Param, Policy, rank_desc
from .registry import policy_class, register

SCORERS = ("h2o", "snapkv", "tova")


@register
class AdaKV(Policy):
    """Per layer: keep ``budget · H_kv`` slots in total, spread over its kv-heads unevenly.

    Scores ``(L, H_kv, T)`` come from ``scorer`` (its own rule, at its default knobs; they are
    attention shares, so heads compare).  In each layer, every head first keeps its forced slots
    (protected spans, the newest ``recent``) and, as a safeguard, its own ``⌊alpha · budget⌋`` best
    slots; the rest of the layer's ``budget · H_kv`` goes to the highest scores of all heads
    ranked together.  Returns a keep mask ``(L, H_kv, T)``: heads of one layer keep different
    numbers of slots (the engine pads the shorter ones and hides the padding from attention).
    """

    name = "adakv"
    summary = "Share each layer's memory among its heads by need: heads with spread-out attention get more slots."
    source = "Ada-KV — Feng et al., 2024 (arXiv:2407.11550)"
    params = (
        Param("scorer", "snapkv", choices=SCORERS, help="the score the heads are ranked by"),
        Param("alpha", 0.2, 0.0, 1.0, 0.05, "safeguard: each head keeps at least alpha · budget of its own best slots"),
        Param("recent", 32, 0, 1024, 1, "newest tokens always kept"),
    )
    window_rows = 64  # the widest observation window a scorer may ask for (snapkv's)

    def __init__(self, **values) -> None:
        super().__init__(**values)
        # only the scorer's score() is used: its budget just has to admit its default windows
        self.ranker: Policy = policy_class(self.scorer)(budget=16384)

    def score(self, view: CacheView) -> torch.Tensor:
        return self.ranker.score(view)

    def select(self, view: CacheView) -> torch.Tensor:
        layers, heads, total = view.positions.shape
        valid = torch.ones(layers, heads, total, dtype=torch.bool) if view.valid is None else view.valid
        forced = self.forced(view)
        budget = self.target(view.seen)
        scores = torch.nan_to_num(self.score(view).float(), nan=-3e38, posinf=3e38, neginf=-3e38)
        ranked = torch.where(valid, scores, torch.full_like(scores, float("-inf")))
        # each head: its forced slots, then its own best ⌊alpha · budget⌋
        floor = forced.sum(-1, keepdim=True) + int(self.alpha * budget)
        own = rank_desc(torch.where(forced, torch.full_like(ranked, float("inf")), ranked)) < floor
        own &= valid
        # the layer: those, then the best of all heads together up to budget · H_kv
        layer_rank = rank_desc(torch.where(own, torch.full_like(ranked, float("inf")), ranked).reshape(layers, -1))
        wanted = torch.maximum(own.reshape(layers, -1).sum(-1), torch.tensor(budget * heads))
        wanted = torch.minimum(wanted, valid.reshape(layers, -1).sum(-1))
        return (layer_rank < wanted[:, None]).reshape(layers, heads, total)
