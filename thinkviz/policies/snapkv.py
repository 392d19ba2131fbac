"""snapkv: the observation window's mean attention, pooled over the tokens before the window.

Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", 2024
(arXiv:2404.14469).  The rule follows the authors' code, ``SnapKVCluster.update_kv`` in
FasterDecoding/SnapKV ``snapkv/monkeypatch/snapkv_utils.py``, and NVIDIA/kvpress
``kvpress/presses/snapkv_press.py``: the last ``W`` queries vote (their attention, averaged over
the queries), the votes of the tokens *before* the window are average-pooled (zero padding at
both ends of that prefix, the kernel always the divisor), and the window itself is kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import CacheView, Param, Policy, PolicyConfigError, ScoreScale
from .registry import register

POOLS = ("avg", "max")


def pool_prefix(
    votes: torch.Tensor, positions: torch.Tensor, prefix: torch.Tensor, kernel: int, pool: str
) -> torch.Tensor:
    """``votes`` ``(L, H_kv, T)`` with the ``prefix`` slots' votes pooled over the prefix only.

    The prefix slots (``prefix`` ``(L, H_kv, T)`` bool) are taken in the order of their
    ``positions`` and pooled as one contiguous sequence with ``kernel`` and ``pool`` (``avg``:
    ``avg_pool1d`` with zero padding, the divisor always ``kernel``; ``max``: ``max_pool1d``), as
    the authors pool ``attn[..., :-W]``: nothing beyond the prefix (the window, a hole of a ragged
    cache) enters a prefix slot's score.  Slots outside the prefix keep their own vote.
    """
    layers, heads, total = votes.shape
    order = torch.where(prefix, positions, torch.iinfo(positions.dtype).max).argsort(dim=-1, stable=True)
    compact = torch.where(prefix, votes, torch.zeros_like(votes)).gather(-1, order)  # prefix first, then zeros
    rows = compact.reshape(layers * heads, 1, total)
    pooling = F.avg_pool1d if pool == "avg" else F.max_pool1d
    pooled = pooling(rows, kernel, stride=1, padding=kernel // 2).reshape(layers, heads, total)
    by_slot = torch.empty_like(pooled).scatter_(-1, order, pooled)
    return torch.where(prefix, by_slot, votes)


@register
class SnapKV(Policy):
    """Score ``(L, H_kv, T)``: each slot's attention from the last ``window`` queries, averaged
    over those queries (and, as the engine records it, over the query heads of its kv group);
    for the tokens before the window, pooled with ``kernel`` over those tokens only (``pool``:
    ``avg``, SnapKV's and kvpress's default, or ``max``, AdaKV's), so the neighbours of a salient
    token survive with it.  The observation window itself (the newest ``window`` tokens) is
    always kept and scored by its own votes, unpooled.

    Follows FasterDecoding/SnapKV ``snapkv/monkeypatch/snapkv_utils.py`` (``SnapKVCluster``) and
    NVIDIA/kvpress ``kvpress/presses/snapkv_press.py``.  Departures: (1) it runs at decode time, on
    every compression, so "the tokens before the window" are the ones still cached, pooled in
    position order (an evicted token's neighbours are the kept tokens around it); (2) the window
    defaults to 32 queries, not the 64 of SnapKV's cluster class: here the window is also the
    newest tokens always kept out of every budget, and 64 would spend a quarter of the default
    256 slots (more of a small fraction budget) on recency, where 32 is SnapKV's own fallback in
    ``init_snapkv`` and AdaKV's default; (3) the query-head group is averaged before pooling
    (the engine keeps the group mean): for ``avg`` pooling that is the same score as kvpress's
    mean after pooling (pooling is linear), for ``max`` it is AdaKV's and KVCache-Factory's order.
    """

    name = "snapkv"
    score_scale = ScoreScale(
        "attention from the newest `window` queries, pooled over neighbours",
        "outside the window's focus",
        "voted for by the observation window",
    )
    summary = "Look at what the last few tokens attend to, smooth it over neighbours, keep the peaks."
    source = (
        "SnapKV — Li et al., 2024 (arXiv:2404.14469); code: FasterDecoding/SnapKV "
        "snapkv/monkeypatch/snapkv_utils.py, NVIDIA/kvpress kvpress/presses/snapkv_press.py"
    )
    params = (
        Param("window", 32, 1, 64, 1, "observation window: newest queries whose attention votes; always kept"),
        Param("kernel", 5, 1, 15, 2, "pooling width (odd)"),
        Param("pool", "avg", choices=POOLS, help="pooling of the votes: avg (SnapKV, kvpress) or max (AdaKV)"),
    )
    window_rows = 64

    def __init__(self, **values) -> None:
        super().__init__(**values)
        if self.kernel % 2 == 0:
            raise PolicyConfigError(f"kernel must be odd, got {self.kernel}")
        self.recent = self.window
        if self.fraction is None and self.recent >= self.budget:
            raise PolicyConfigError(f"budget ({self.budget}) must be larger than window ({self.recent})")

    def score(self, view: CacheView) -> torch.Tensor:
        votes = view.window[:, :, -self.window :, :].mean(dim=2)  # (L, H_kv, T)
        prefix = view.positions <= view.current - self.window
        if view.valid is not None:
            prefix &= view.valid
        return pool_prefix(votes, view.positions, prefix, self.kernel, self.pool)
