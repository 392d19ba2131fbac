"""random: uniform random eviction with a seed — the baseline every paper reports.

Each (layer, kv-head, position) draws one priority, uniform in [0, 1), from a generator seeded
with ``seed``, the first time the policy sees that position; compressions keep the highest
priorities.  So the unforced part of the cache is, at every step, a uniform random sample of
the tokens seen so far (each position equally likely to be held), and the same ``seed`` gives
the same keep sets whatever the interval or prefill chunking.
"""

from __future__ import annotations

import torch

from .base import CacheView, Param, Policy
from .registry import register


@register
class RandomEviction(Policy):
    """Score ``(L, H_kv, T)`` = the slot's priority: a table ``(L, H_kv, N)`` of uniform draws, one
    column per position drawn in position order from ``torch.Generator().manual_seed(seed)``,
    looked up by each slot's position.  The newest ``recent`` tokens are always kept.

    No paper to depart from: a baseline, as kvpress's RandomPress."""

    name = "random"
    score_scale = None  # a random draw: nothing graded
    summary = "Evict at random (with a seed): the floor any real rule must beat."
    source = "uniform random baseline (e.g. kvpress RandomPress; reported in most eviction papers)"
    params = (
        Param("seed", 0, 0, 65535, 1, "random seed: the same seed gives the same keep sets"),
        Param("recent", 0, 0, 1024, 1, "newest tokens always kept (0 = purely random)"),
    )
    reads_attention = False

    def __init__(self, **values) -> None:
        super().__init__(**values)
        self._generator = torch.Generator().manual_seed(self.seed)
        self._priority: torch.Tensor | None = None  # (L, H_kv, N)

    def priorities(self, layers: int, heads: int, seen: int) -> torch.Tensor:
        """``(L, H_kv, seen)`` the priority of every position so far, drawn once each, in order."""
        have = 0 if self._priority is None else self._priority.shape[-1]
        if seen > have:
            # one (L, H_kv) draw per position, so the table never depends on how positions arrive
            drawn = [torch.rand(layers, heads, generator=self._generator) for _ in range(seen - have)]
            block = torch.stack(drawn, dim=-1)
            self._priority = block if self._priority is None else torch.cat([self._priority, block], dim=-1)
        return self._priority[..., :seen]

    def score(self, view: CacheView) -> torch.Tensor:
        layers, heads, _ = view.positions.shape
        table = self.priorities(layers, heads, view.current + 1)
        return table.gather(-1, view.positions.cpu())
