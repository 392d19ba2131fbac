"""Importance heat a class can read: which tokens a policy ranks, and each one's heat class 0 … 9.

A policy keeps some tokens by rule whatever their score (:meth:`~thinkviz.policies.Policy.forced`:
its recent window, the first ``n_sink`` positions, the protected spans); their score decides
nothing, so the view draws them "kept by rule" (:func:`ranked_tokens`), not on the heat ramp.

The others get a class by rank, never by magnitude (no outlier washes a frame out).  Ranked over
the whole frame (:func:`heat_levels` without ``neighbours``) the newest tokens, the ones a reader
following the run looks at, all land at one end: a per-query mean gives a young token, seen by
few queries, the top of the ramp, and H2O's accumulated attention (Zhang et al., 2023) gives it
the bottom.  So the policy's own score is ranked *within comparable ages*: each token among the
:data:`HEAT_NEIGHBOURS` ranked tokens nearest to it in position (nearest in age), a local
contrast that gives every stretch of the text, the newest included, the same share of each class.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

HEAT_LEVELS = 10  # tv-h0 … tv-h9
# Lower edges of bands 1 … 9 as a share of the scores ranked together (the square roots of 0.1 … 0.9):
# most tokens stay light, the hottest colour marks the top ~5 %, the two hottest ~11 %.
HEAT_BANDS = np.sqrt(np.arange(1, HEAT_LEVELS) / HEAT_LEVELS)
# How many tokens of comparable age a policy's score is ranked among (fewer than a Compare column shows).
HEAT_NEIGHBOURS = 64
HEAT_PALETTE = (
    "#fffaf0",
    "#fff1c2",
    "#ffe495",
    "#ffd26b",
    "#ffbd52",
    "#ffa547",
    "#ff8c42",
    "#fb7544",
    "#f5604a",
    "#ee5050",
)  # black text stays readable on each
RULE_COLOUR = "#dbe7f5"  # kept by rule: a cool blue off the warm ramp


def heat_colour(level: int) -> str:
    """Background of importance ``level`` (:data:`HEAT_PALETTE`: cream → orange → coral)."""
    return HEAT_PALETTE[level]


def ranked_tokens(n: int, recent: int, sinks: int, protected: Sequence[tuple[int, int]] = ()) -> np.ndarray | None:
    """``(n,)`` bool: the tokens a policy ranks by score, ``False`` for those it keeps by rule
    (:meth:`~thinkviz.policies.Policy.forced`): its newest ``recent``, its first ``sinks`` and the
    ``protected`` spans ``(start, end)``; ``None`` when it keeps none of the ``n`` by rule."""
    ranked = np.ones(n, dtype=bool)
    ranked[max(0, n - recent) :] = False
    ranked[: max(0, sinks)] = False
    for start, end in protected:
        ranked[max(0, start) : max(0, end)] = False
    return None if ranked.all() else ranked


def heat_levels(
    scores: Sequence[float] | np.ndarray | None,
    n: int,
    ranked: Sequence[bool] | np.ndarray | None = None,
    neighbours: int | None = None,
) -> np.ndarray:
    """``(n,)`` int: importance level ``0 … HEAT_LEVELS-1``, ``-1`` where there is no finite score
    or the token is not among ``ranked`` (``(n,)`` bool; ``None``: all are).

    A score's level is its rank among the ``m`` finite ranked scores (``neighbours`` ``None``) or
    among the ``neighbours`` of them nearest in position (a window centred on it where the text
    allows): ``q`` = the share of the others strictly below it (``0`` lowest, ``1`` highest; ties
    share their lowest rank, so a large tie never fills the top band), cut at :data:`HEAT_BANDS`.
    """
    levels = np.full(n, -1, dtype=np.int64)
    if scores is None:
        return levels
    values = np.asarray(scores, dtype=np.float64)
    finite = np.isfinite(values) & (True if ranked is None else np.asarray(ranked, dtype=bool))
    if finite.any():
        levels[finite] = np.searchsorted(HEAT_BANDS, _share_below(values[finite], neighbours), side="right")
    return levels


def _share_below(values: np.ndarray, neighbours: int | None) -> np.ndarray:
    """``(m,)`` in ``[0, 1]``: for each of ``values`` ``(m,)`` the share of the others strictly below
    it, among all of them or among the window of ``neighbours`` nearest in position."""
    m = len(values)
    if neighbours is None or m <= neighbours:
        ordered = np.sort(values)
        return np.searchsorted(ordered, values, side="left") / max(1, m - 1)
    windows = sliding_window_view(values, neighbours)  # (m - neighbours + 1, neighbours)
    first = np.clip(np.arange(m) - neighbours // 2, 0, m - neighbours)
    return (windows[first] < values[:, None]).sum(axis=1) / (neighbours - 1)
