"""pyramidkv: per-layer budgets that shrink with depth, SnapKV scores within each layer.

Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information
Funneling", 2024 (arXiv:2406.02069).  Lower layers spread their attention over the whole
context, upper layers concentrate it on a few tokens, so the lower layers get more of the
memory and the upper ones less, for the same total.  The budgets follow the authors' code,
``PyramidKVCluster.update_kv`` in Zefan-Cai/KVCache-Factory ``pyramidkv/pyramidkv_utils.py``.
"""

from __future__ import annotations

import math

import torch

from .base import CacheView, Param, keep_counts
from .registry import register
from .snapkv import SnapKV


def pyramid_budgets(budget: int, layers: int, seen: int, floor: int, beta: float) -> list[int]:
    """Tokens per kv-head for each layer, bottom first: an arithmetic sequence that sums to
    ``budget · layers`` exactly and never increases with depth.

    As in KVCache-Factory's ``PyramidKVCluster``, with ``S = budget − floor`` (``floor``: what every
    layer must keep, the observation window and protected spans; theirs is the window): every
    layer keeps ``budget`` while ``seen < 2 S`` (or ``S ≤ 0``); from ``seen = 2 S`` on, the top layer
    keeps ``floor + S / beta`` and the bottom ``floor + 2 S − S / beta``, the bottom clipped to the
    ``seen − floor`` tokens there are (the top then takes what the bottom gave up), the layers
    between on the straight line.  One departure: they round down (``S // beta``, the step
    ``// (layers − 1)``), so their layers sum to more than ``budget · layers`` and the top keeps
    more (budget 256, window 16, beta 20, 28 layers: their top keeps 16 + 36 and their total is
    5 % over; here 16 + 12 and the total exact).  Here the integer parts get one more for the
    largest remainders (lower layers first on ties).
    """
    spare = budget - floor
    if layers == 1 or spare <= 0 or seen < 2 * spare:
        return [budget] * layers
    high = min(2 * spare - spare / beta, seen - floor)
    low = 2 * spare - high
    step = (high - low) / (layers - 1)
    exact = [floor + high - layer * step for layer in range(layers)]
    counts = [math.floor(x) for x in exact]
    extra = budget * layers - sum(counts)
    by_remainder = sorted(range(layers), key=lambda layer: (counts[layer] - exact[layer], layer))
    for layer in by_remainder[:extra]:
        counts[layer] += 1
    return counts


@register
class PyramidKV(SnapKV):
    """Per layer ``l`` of ``L``: keep ``k_l`` slots in every kv-head, ``k_l`` from
    :func:`pyramid_budgets` (``Σ k_l = budget · L``, ``k_0 ≥ k_1 ≥ …``), chosen by the SnapKV score
    ``(L, H_kv, T)`` (:class:`~thinkviz.policies.snapkv.SnapKV`'s: the last ``window`` queries' mean
    attention, pooled with ``kernel`` over the tokens before the window).
    The protected spans and the observation window are always kept: they are the pyramid's floor,
    so the pyramid shares out the rest (if they alone exceed ``budget``, every layer keeps them
    and nothing else).  A layer never keeps more than it holds: when the pyramid starts, the
    bottom layers hold only ``budget`` and fill up to their share with the tokens that follow.
    Returns a keep mask ``(L, H_kv, T)``: the layers' caches have different lengths.  Follows
    Zefan-Cai/KVCache-Factory ``pyramidkv/pyramidkv_utils.py`` (``PyramidKVCluster``); departures:
    the exact-total rounding of :func:`pyramid_budgets`, and it runs at decode time on every
    compression, where theirs cuts the prompt once."""

    name = "pyramidkv"
    summary = "SnapKV with a pyramid: the lower layers, which look everywhere, get more memory than the upper ones."
    source = (
        "PyramidKV — Cai et al., 2024 (arXiv:2406.02069); code: Zefan-Cai/KVCache-Factory pyramidkv/pyramidkv_utils.py"
    )
    params = (
        *SnapKV.params,
        Param(
            "beta",
            20.0,
            1.0,
            100.0,
            1.0,
            "pyramid steepness: the top layer keeps 1/beta of the mean share beyond what every layer must keep",
        ),
    )

    def select(self, view: CacheView) -> torch.Tensor:
        layers, heads, _ = view.positions.shape
        forced = self.forced(view)
        floor = int(forced.sum(-1).max())
        budgets = pyramid_budgets(self.target(view.seen), layers, view.seen, floor, self.beta)
        counts = torch.tensor(budgets)[:, None].expand(layers, heads)
        return keep_counts(self.score(view), forced, counts, view.valid)
