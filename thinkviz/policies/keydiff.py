"""keydiff: keep the keys least similar to the mean key — no attention needed.

Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
Inference in Resource-Constrained Environments", 2025 (arXiv:2504.15364).  A key that
looks like the average key carries little that the others do not; distinctive keys stay.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import CacheView, Param, Policy, ScoreScale
from .registry import register


@register
class KeyDiff(Policy):
    """Score ``(L, H_kv, T)`` = ``−cos(k, a)``: ``a`` ``(H_kv, 1, D)`` is the anchor, the mean of the
    head's unit-normalised keys ``(H_kv, T, D)``; the least similar keys are kept first.  The
    anchor is recomputed over the slots present at every compression (the paper's block-wise
    eviction with the block = ``interval``).  The newest ``recent`` tokens are always kept.

    Where ThinkViz departs from the paper: only in the ``recent`` window (default 32), which
    KeyDiff does not have; ``recent=0`` is the paper's rule."""

    name = "keydiff"
    score_scale = ScoreScale(
        "how unlike the mean key the token's key is",
        "like the mean key: evicted first",
        "unlike the mean key: kept first",
    )
    summary = "Keep the most distinctive keys: the ones pointing furthest from the average key, no attention needed."
    source = "KeyDiff — Park et al., 2025 (arXiv:2504.15364)"
    params = (Param("recent", 32, 0, 1024, 1, "newest tokens always kept (0 = the pure similarity rule)"),)
    reads_attention = False

    def score(self, view: CacheView) -> torch.Tensor:
        return view.key_scores(dissimilarity)


def dissimilarity(keys: torch.Tensor) -> torch.Tensor:
    """``(H_kv, T)`` negated cosine similarity of each key ``(H_kv, T, D)`` to its head's anchor."""
    anchor = F.normalize(keys, dim=-1).mean(dim=1, keepdim=True)  # (H_kv, 1, D)
    return -F.cosine_similarity(keys, anchor, dim=-1)
