"""adakv: one layer's budget shared out over its kv-heads by ranking all heads' scores together.

Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for
Efficient LLM Inference", 2024 (arXiv:2407.11550).  Some heads attend to a few tokens, others
to many; one budget per head wastes memory on the first kind and starves the second.  Ranking
the scores of every head of a layer together gives each head as many slots as its share of
the layer's top scores.  The allocation follows the authors' code,
``AdaptiveSnapKVCluster.update_kv_gqa`` in FFY0/AdaKV ``adaptive_snapkv/monkeypatch/snapkv_utils.py``.
"""

from __future__ import annotations

import torch

from .base import CacheView, Param, Policy, keep_counts, rank_desc
from .registry import policy_class, register

SCORERS = ("h2o", "snapkv", "tova")
# AdaKV's defaults for its SnapKV scores (`config_compress`: kernel 7, max pooling, window 32)
ADAKV_SNAPKV = {"kernel": 7, "pool": "max"}


def adaptive_counts(scores: torch.Tensor, candidates: torch.Tensor, spare: torch.Tensor, alpha: float) -> torch.Tensor:
    """``(L, H_kv)`` slots each head keeps beyond its forced ones, as AdaKV's code counts them.

    ``spare`` ``(L, H_kv)`` is a head's budget less its forced slots (AdaKV's ``B − W``).  In each
    layer the ``Σ spare`` best ``scores`` ``(L, H_kv, T)`` among the ``candidates`` (held, not forced)
    of all heads together give head ``h`` its adaptive count ``c_h``; it then keeps
    ``round(c_h · (1 − alpha) + ⌊alpha · spare_h⌋)``: a blend of the adaptive count and a floor
    (``torch.round``, halves to even, as theirs).  The counts need not sum to ``Σ spare``.
    """
    layers, heads, total = scores.shape
    finite = torch.nan_to_num(scores.float(), nan=-3e38, posinf=3e38, neginf=-3e38)
    ranked = torch.where(candidates, finite, torch.full_like(finite, float("-inf"))).reshape(layers, -1)
    top = (rank_desc(ranked) < spare.sum(-1, keepdim=True)) & candidates.reshape(layers, -1)
    adaptive = top.reshape(layers, heads, total).sum(-1).double()
    floor = (alpha * spare.double()).floor()
    return torch.round(adaptive * (1 - alpha) + floor).long()


@register
class AdaKV(Policy):
    """Per layer: each kv-head keeps its forced slots (protected spans, the newest ``recent``:
    AdaKV's window) and ``round(c_h · (1 − alpha) + ⌊alpha · (budget − forced)⌋)`` more, where
    ``c_h`` is how many of the layer's ``H_kv · (budget − forced)`` best scores, all heads ranked
    together, are head ``h``'s.  The window is counted *inside* the budget, as AdaKV's code
    counts it (``base_capacity − window_size``); with ``alpha = 0`` a layer keeps exactly
    ``budget · H_kv``, otherwise the rounding may keep a few slots more or fewer.  A head whose
    scores are starved keeps its forced slots and the floor ``⌊alpha · (budget − forced)⌋``.

    Scores ``(L, H_kv, T)`` come from ``scorer`` (attention shares, so heads compare): ``snapkv``
    as AdaKV runs it (max pooling, kernel 7, the window voting = the newest ``recent`` queries, at
    most 64), ``h2o`` and ``tova`` at their defaults.  Returns a keep mask ``(L, H_kv, T)``: heads of
    one layer keep different numbers of slots (the engine pads the shorter ones and hides the
    padding from attention).  Follows FFY0/AdaKV ``adaptive_snapkv/monkeypatch/snapkv_utils.py``
    (``AdaptiveSnapKVCluster``, GQA path, ``gqa_func = mean``).  Departures: it runs at decode time
    on every compression; the forced slots include the protected spans; ``skip`` and ``normalize``
    (off in their defaults) are not offered.
    """

    name = "adakv"
    summary = "Share each layer's memory among its heads by need: heads with spread-out attention get more slots."
    source = (
        "Ada-KV — Feng et al., 2024 (arXiv:2407.11550); code: FFY0/AdaKV adaptive_snapkv/monkeypatch/snapkv_utils.py"
    )
    params = (
        Param("scorer", "snapkv", choices=SCORERS, help="the score the heads are ranked by"),
        Param(
            "alpha",
            0.2,
            0.0,
            1.0,
            0.05,
            "floor: each head keeps round(c · (1 − alpha) + ⌊alpha · (budget − forced)⌋) beyond its forced slots",
        ),
        Param("recent", 32, 0, 1024, 1, "AdaKV's window: newest tokens always kept (and snapkv's voters)"),
    )
    window_rows = 64  # the widest observation window a scorer may ask for (snapkv's)

    def __init__(self, **values) -> None:
        super().__init__(**values)
        knobs = {**ADAKV_SNAPKV, "window": min(max(self.recent, 1), 64)} if self.scorer == "snapkv" else {}
        # only the scorer's score() is used: its budget just has to admit its windows
        self.ranker: Policy = policy_class(self.scorer)(budget=16384, **knobs)

    def score(self, view: CacheView) -> torch.Tensor:
        return self.ranker.score(view)

    def select(self, view: CacheView) -> torch.Tensor:
        held = torch.ones_like(view.positions, dtype=torch.bool) if view.valid is None else view.valid
        forced = self.forced(view)
        scores = self.score(view)
        spare = (self.target(view.seen) - forced.sum(-1)).clamp(min=0)  # (L, H_kv)
        extra = adaptive_counts(scores, held & ~forced, spare, self.alpha)
        return keep_counts(scores, forced, forced.sum(-1) + extra, view.valid)
