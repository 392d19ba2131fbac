"""tova: Token Omission Via Attention — attention from the newest query, averaged over heads.

Oren et al., "Transformers are Multi-State RNNs", 2024 (arXiv:2401.06104).
"""

from __future__ import annotations

import torch

from .base import CacheView, Policy, ScoreScale
from .registry import register


@register
class TokenOmissionViaAttention(Policy):
    """Score ``(L, H_kv, T)`` = the newest query's attention, mean over the layer's heads.

    Every head of a layer therefore keeps the same tokens (a layer-wise decision, as in TOVA).

    Where ThinkViz departs from the paper: TOVA drops one token at every decoding step; ThinkViz
    compresses every ``interval`` tokens, scored by the newest query alone (``interval=1`` is
    the paper's rule).  Protected spans are kept whatever their score.
    """

    name = "tova"
    score_scale = ScoreScale(
        "attention from the newest token (mean over the heads of a kv group)",
        "ignored by the newest token",
        "attended by the newest token",
    )
    summary = "Ask the newest token: drop whatever it pays the least attention to (averaged over heads)."
    source = "TOVA — Oren et al., 2024 (arXiv:2401.06104)"

    def score(self, view: CacheView) -> torch.Tensor:
        return view.last.mean(dim=1, keepdim=True).expand_as(view.last)
