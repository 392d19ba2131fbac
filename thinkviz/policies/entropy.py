"""entropy: keep the tokens whose own attention is focused (low entropy): semantic KV-eviction.

Semantic KV-eviction via attention-weight entropy (the article "The Death of the Static Prompt:
How Semantic KV-Eviction is Supercharging Local Reasoning Models") reads the Shannon entropy of a
token's attention row as a signal: a row spread evenly over the context marks grammatical
glue, a row that looks at a few slots marks a logical anchor (a formula, a definition).
Importance is ``1 / (H + ε)``; the article names two knobs, ``max_capacity_tokens`` and
``retention_threshold``, without fixing what the threshold does.  The rule here:

1. ``H_p`` = ``CacheView.token_entropy[p]`` (bits; mean over layers and query heads of token
   ``p``'s own attention row).  A non-finite ``H_p`` counts as ``+inf`` (no evidence of focus);
   an all-zero row has ``H_p = 0`` and counts as perfectly focused.
2. Importance ``I_p = 1 / (H_p + ε)``, ``ε = 1e-5`` (0 when ``H_p`` is ``+inf``): the score shown
   and the order in which tokens are kept.
3. Relative entropy ``ρ_p = H_p / max(log2(p + 1), 1)``: the entropy as a fraction of a uniform
   row over the ``p + 1`` slots token ``p`` could see (0 = all attention on one slot, 1 =
   uniform).  Raw entropy favours early tokens, which simply had fewer slots to spread over;
   ``ρ`` does not.  Tokens with ``ρ_p ≤ retention_threshold`` are *anchors*.  (Measured on the
   embedded SmolLM2 over a coding trace: ``ρ`` spans about 0.3–0.6, median 0.39; the default
   0.3 makes the most focused few percent — code identifiers, numbers — anchors.  The article's
   0.15 would leave only the first token.)
4. When the cache exceeds ``budget`` it is cut to
   ``k = min(budget, max(max_capacity_tokens, forced + anchors))`` slots (never fewer than the
   forced = protected ones, never more than exist): forced first, then anchors by importance,
   then the other tokens by importance.  So ``budget`` decides *when* to compress and
   ``max_capacity_tokens`` *to how many*; anchors may stay beyond the capacity, up to the budget.

The decision is per position: every layer and kv-head keeps the same tokens.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .base import CacheView, Param, Policy, ScoreScale, keep_top
from .registry import register

EPSILON = 1e-5


def entropy_importance(entropy: torch.Tensor) -> torch.Tensor:
    """``(N,)`` importance ``1 / (H + ε)`` from entropies in bits; non-finite or negative → 0."""
    entropy = entropy.float()
    usable = torch.isfinite(entropy) & (entropy >= 0)
    return torch.where(usable, 1.0 / (entropy.clamp(min=0) + EPSILON), torch.zeros_like(entropy))


def relative_entropy(entropy: torch.Tensor) -> torch.Tensor:
    """``(N,)`` ``ρ_p = H_p / max(log2(p + 1), 1)``; non-finite or negative ``H`` → ``+inf``."""
    entropy = entropy.float()
    uniform = torch.log2(torch.arange(1, len(entropy) + 1, dtype=torch.float32)).clamp(min=1.0)
    usable = torch.isfinite(entropy) & (entropy >= 0)
    return torch.where(usable, entropy / uniform, torch.full_like(entropy, math.inf))


@register
class EntropyAnchors(Policy):
    """Score ``(L, H_kv, T)`` = ``1 / (H + ε)`` of each slot's token; low-entropy anchors kept first
    (exact rule in the module docstring).

    Where ThinkViz departs from the article: the article names the signal and its two knobs but
    gives no rule for the threshold; the relative entropy, the anchors and the cut to
    ``max_capacity_tokens`` are ThinkViz's reading of it, and the default threshold is 0.3,
    not the article's 0.15, which on the embedded model leaves only the first token an anchor."""

    name = "entropy"
    score_scale = ScoreScale(
        "how focused the token's own attention is (1 / entropy)",
        "diffuse attention",
        "sharply focused: an anchor",
    )
    summary = (
        "Keep tokens that paid focused attention (low entropy: anchors such as formulas); "
        "drop those whose attention was spread evenly (glue words)."
    )
    source = "Semantic KV-eviction by attention entropy (article: 'The Death of the Static Prompt')"
    params = (
        Param(
            "max_capacity_tokens",
            16384,
            8,
            16384,
            8,
            "when over budget, cut the cache down to this many tokens (anchors may stay, up to the budget)",
        ),
        Param(
            "retention_threshold",
            0.3,
            0.0,
            1.0,
            0.01,
            "anchor: a token whose attention entropy is at most this fraction of a uniform row's",
        ),
    )

    def score(self, view: CacheView) -> torch.Tensor:
        return view.by_position(entropy_importance(view.token_entropy))

    def anchors(self, view: CacheView) -> torch.Tensor:
        """``(N,)`` bool: tokens with relative entropy at or below ``retention_threshold``."""
        return relative_entropy(view.token_entropy) <= self.retention_threshold

    def select(self, view: CacheView) -> torch.Tensor:
        forced = self.forced(view)
        anchors = view.by_position(self.anchors(view))  # (L, H_kv, T)
        n_forced = int(forced.sum(-1).max())
        wanted = max(self.max_capacity_tokens, int((forced | anchors).sum(-1).max()))
        k = min(forced.shape[-1], max(n_forced, min(self.target(view.seen), wanted)))
        importance = self.score(view)
        priority = anchors.float() + importance / (1.0 + importance)  # anchors above all others, in [0, 2)
        return keep_top(priority, forced, k)

    def step_info(self, view: CacheView) -> dict[str, Any]:
        present = torch.zeros(len(view.token_entropy), dtype=torch.bool)
        present[view.positions.flatten()] = True
        return {"anchors_in_cache": int((self.anchors(view) & present).sum())}
