"""knorm: keep the keys with the lowest L2 norm — no attention needed.

Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression",
EMNLP 2024 (arXiv:2406.11430).  Keys with a small norm tend to receive the most attention,
so the norm alone, read from the cache, stands in for the attention score.
"""

from __future__ import annotations

import torch

from .base import CacheView, Param, Policy, ScoreScale
from .registry import register


@register
class KeyNorm(Policy):
    """Score ``(L, H_kv, T)`` = ``−‖k‖₂``, the negated L2 norm of each cached key ``(H_kv, T, D)``
    (low-norm keys are kept first), rounded to bfloat16 precision (about 3 significant digits).
    The rounding matters in the first layer: there a key is the token's embedding projected and
    rotated, rotation keeps the norm, so every copy of a token has the same norm up to float
    noise; rounded, the copies tie exactly and the choice among them no longer depends on how
    the tokens were batched.  On models that normalise each head's keys before the rotation
    (Qwen3's ``k_norm``) the norms differ only through the learned norm weights, so the rule has
    less to go on there.  The newest ``recent`` tokens are always kept.  Reads only the keys,
    never the attention weights.

    Where ThinkViz departs from the paper: the bfloat16 rounding above (ties broken the same
    way however the run was chunked) and the ``recent`` window (default 32); ``recent=0`` is
    the paper's rule up to that rounding."""

    name = "knorm"
    score_scale = ScoreScale(
        "minus the norm of the token's key",
        "large key norm: evicted first",
        "small key norm: kept first",
    )
    summary = "Keep the keys with the smallest length: they are the ones attention tends to pick, no attention needed."
    source = "K-norm — Devoto et al., EMNLP 2024 (arXiv:2406.11430)"
    params = (Param("recent", 32, 0, 1024, 1, "newest tokens always kept (0 = the pure norm rule)"),)
    reads_attention = False

    def score(self, view: CacheView) -> torch.Tensor:
        return view.key_scores(lambda keys: -keys.norm(dim=-1).to(torch.bfloat16).float())
