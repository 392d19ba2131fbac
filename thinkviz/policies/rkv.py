"""rkv: R-KV — attention importance minus redundancy between keys.

Cai et al., "R-KV: Redundancy-aware KV Cache Compression for Reasoning Models", 2025
(arXiv:2505.24133).  Reasoning traces repeat themselves (re-checks, restated facts), so many
cached keys say the same thing; R-KV keeps what is both attended to and not already covered.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import CacheView, Param, Policy, ScoreScale
from .registry import register

_ROWS_PER_CHUNK = 1024  # similarity rows computed at once: (H_kv, 1024, T) floats


def redundancy(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``(H_kv, T)``: for each slot, the highest cosine similarity (clamped at 0) between its key
    and the key of any *newer* slot in the same head; the newest copy of a repeated key scores 0.

    ``keys`` ``(H_kv, T, D)``, ``positions`` ``(H_kv, T)``.  Rows are computed in chunks, so memory
    stays ``O(H_kv · 1024 · T)`` whatever ``T``.
    """
    unit = F.normalize(keys.float(), dim=-1)
    positions = positions.to(unit.device)
    out = torch.zeros(positions.shape, device=unit.device)
    for lo in range(0, unit.shape[1], _ROWS_PER_CHUNK):
        rows = slice(lo, lo + _ROWS_PER_CHUNK)
        similarity = unit[:, rows] @ unit.transpose(1, 2)  # (H_kv, r, T)
        similarity.masked_fill_(positions[:, None, :] <= positions[:, rows, None], 0.0)  # only newer keys
        out[:, rows] = similarity.amax(-1).clamp(min=0)
    return out


@register
class RedundancyAwareKV(Policy):
    """Score ``(L, H_kv, T)`` = ``a − lam · r``: ``a`` the mean attention from the last ``window``
    queries divided by its maximum in the head (so ``a ∈ [0, 1]``), ``r`` :func:`redundancy`
    (``∈ [0, 1]``).  Of two identical keys the older loses ``lam``.  The newest ``recent`` tokens
    are always kept.

    Where ThinkViz departs from the paper: R-KV mixes the two terms as ``λ·importance −
    (1 − λ)·redundancy``, pools the window's attention over neighbouring tokens, and measures
    redundancy as a key's similarity to all others, sparing the newest few copies above a
    similarity threshold.  ThinkViz keeps one readable rule: a key's redundancy is its highest
    similarity to any *newer* key (the newest copy is never redundant), subtracted with weight
    ``lam``; no pooling.  The ranking is the paper's idea, not its exact numbers."""

    name = "rkv"
    score_scale = ScoreScale(
        "attention minus λ × redundancy with other tokens",
        "ignored, or repeats other tokens",
        "attended and unlike the rest",
    )
    summary = (
        "Prefer tokens that are attended to AND not repeated: a key much like a newer key is redundant and goes first."
    )
    source = "R-KV — Cai et al., 2025 (arXiv:2505.24133)"
    params = (
        Param("lam", 0.5, 0.0, 2.0, 0.05, "λ: weight of the redundancy penalty"),
        Param("recent", 32, 0, 1024, 1, "newest tokens always kept"),
        Param("window", 8, 1, 64, 1, "newest queries whose attention measures importance"),
    )
    window_rows = 64

    def score(self, view: CacheView) -> torch.Tensor:
        attention = view.window[:, :, -self.window :, :].mean(dim=2)  # (L, H_kv, T)
        peak = attention.amax(-1, keepdim=True)
        normalised = torch.where(peak > 0, attention / peak.clamp(min=1e-30), torch.zeros_like(attention))
        repeated = torch.stack(
            [redundancy(keys[0], view.positions[layer]).cpu() for layer, keys in enumerate(view.keys)]
        )  # (L, H_kv, T)
        return normalised - self.lam * repeated
