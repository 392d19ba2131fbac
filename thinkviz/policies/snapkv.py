"""snapkv: mean attention from the last ``window`` queries, pooled along the sequence.

Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", 2024
(arXiv:2404.14469).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import CacheView, Param, Policy, PolicyConfigError, ScoreScale
from .registry import register


@register
class SnapKV(Policy):
    """Score ``(L, H_kv, T)`` = mean over the last ``window`` query rows ``(L, H_kv, W, T)``,
    then 1-D max-pooled with ``kernel`` so neighbours of a salient token survive with it.
    The observation window itself (the newest ``window`` tokens) is always kept.
    """

    name = "snapkv"
    score_scale = ScoreScale(
        "attention from the newest `window` queries, pooled over neighbours",
        "outside the window's focus",
        "voted for by the observation window",
    )
    summary = "Look at what the last few tokens attend to, smooth it over neighbours, keep the peaks."
    source = "SnapKV — Li et al., 2024 (arXiv:2404.14469)"
    params = (
        Param("window", 16, 1, 64, 1, "observation window: newest queries whose attention votes"),
        Param("kernel", 5, 1, 15, 2, "pooling width (odd)"),
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
        layers, heads, total = votes.shape
        pooled = F.max_pool1d(votes.reshape(layers * heads, 1, total), self.kernel, stride=1, padding=self.kernel // 2)
        return pooled.reshape(layers, heads, total)
