"""merge: h2o selection, but an evicted value is folded into its most similar kept slot.

Layer-wise KV merging (redundant steps are summarised and merged rather than thrown away, as
the article "The Death of the Static Token: How KV-Cache Compression is Revolutionizing Local
AI Reasoning" puts it); the folding rule follows KV-merging work such as CaM (Zhang et al., ICML 2024)
and D2O (Wan et al., 2024): what an evicted entry contributed is kept, approximately, by the
kept entry it most resembles.

The rule, per layer and kv-head, at each compression:

- keep the same slots as ``h2o`` (attention received, summed over every query or per query as
  its ``normalize`` knob says, plus the ``recent`` window);
- every evicted slot ``e`` picks the kept slot ``j`` whose key is most similar (cosine; ties:
  the earlier physical slot);
- kept values become attention-weighted means:
  ``v_j ← (m_j·v_j + Σ_{e→j} m_e·v_e) / (m_j + Σ_{e→j} m_e)``, where ``m`` is the h2o score
  (clamped at 0).  If that total weight is 0 every term counts 1 (a plain mean).

Keys are never changed, so which slot a query attends to stays as before; only what it reads
there changes.  The weight of a kept slot in later merges is its own score again (folded mass
is not carried forward).  Because values change, a step after merging differs from the
full-cache step with the evicted slots masked: the eviction oracle does not apply here.

With a quantized KV format (:mod:`thinkviz.core.kvquant`) the fold reads keys and values as
attention reads them (decoded), and only the kept slots that absorbed an evicted value get new
values, re-encoded by the cache (every format quantizes values per token, so no other slot's
codes change).  Each absorption therefore adds at most one rounding of that slot's new block;
keys and untouched slots keep their codes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import CacheView
from .h2o import HeavyHitters
from .registry import register


def fold_values(keys: torch.Tensor, values: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Values ``(H_kv, T, D_v)`` after folding every slot not in ``keep`` ``(H_kv, k)`` into its most
    similar kept slot (rule in the module docstring).  ``keys`` ``(H_kv, T, D)``, ``weights``
    ``(H_kv, T)`` ≥ 0.  Slots outside ``keep`` are returned unchanged (they are about to go)."""
    return fold(keys, values, weights, keep)[0]


def fold(
    keys: torch.Tensor, values: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fold_values` and the ``(H_kv, T)`` bool mask of the kept slots that absorbed an evicted one."""
    heads, total, _ = keys.shape
    evicted_mask = torch.ones(heads, total, dtype=torch.bool, device=keys.device)
    evicted_mask.scatter_(1, keep, False)
    absorbed = torch.zeros(heads, total, dtype=torch.bool, device=keys.device)
    if not evicted_mask.any():
        return values, absorbed
    evicted = evicted_mask.nonzero()[:, 1].view(heads, -1)  # (H_kv, e): every head drops as many
    unit = F.normalize(keys.float(), dim=-1)
    kept_keys = unit.gather(1, keep[..., None].expand(-1, -1, unit.shape[-1]))  # (H_kv, k, D)
    gone_keys = unit.gather(1, evicted[..., None].expand(-1, -1, unit.shape[-1]))  # (H_kv, e, D)
    target = (gone_keys @ kept_keys.transpose(1, 2)).argmax(-1)  # (H_kv, e) index into keep
    weights = weights.float().clamp(min=0)
    if float(weights.gather(1, keep).sum() + weights.gather(1, evicted).sum()) == 0:
        weights = torch.ones_like(weights)
    w_kept, w_gone = weights.gather(1, keep), weights.gather(1, evicted)  # (H_kv, k), (H_kv, e)
    v = values.float()
    v_kept = v.gather(1, keep[..., None].expand(-1, -1, v.shape[-1]))  # (H_kv, k, D_v)
    v_gone = v.gather(1, evicted[..., None].expand(-1, -1, v.shape[-1]))
    into = target[..., None].expand_as(v_gone)
    numerator = (w_kept[..., None] * v_kept).scatter_add(1, into, w_gone[..., None] * v_gone)
    denominator = w_kept.scatter_add(1, target, w_gone)  # (H_kv, k)
    safe = denominator > 0
    merged = torch.where(safe[..., None], numerator / denominator.clamp(min=1e-30)[..., None], v_kept)
    out = v.scatter(1, keep[..., None].expand_as(merged), merged)
    absorbed.scatter_(1, keep.gather(1, target), True)
    return out.to(values.dtype), absorbed


@register
class KVMerge(HeavyHitters):
    """h2o's keep set ``(L, H_kv, k)``; evicted values folded into kept ones (module docstring).

    Where ThinkViz departs from its sources: neither CaM nor D2O is followed to the letter.  CaM
    merges an evicted value into the kept ones with a probability set by its attention; D2O
    merges only above a key-similarity threshold, with an exponential moving average, and gives
    each layer its own budget.  ThinkViz folds every evicted value, deterministically, into the
    single most similar kept key, weighted by h2o's score: one simple rule to set beside h2o's
    plain eviction at the same memory."""

    name = "merge"
    summary = "Like h2o, but nothing is simply lost: an evicted value is averaged into the most similar kept entry."
    source = "KV merging (article: 'The Death of the Static Token'; cf. CaM, ICML 2024, and D2O, 2024)"

    def compress(self, view: CacheView, cache) -> torch.Tensor:
        keep = self.select(view)  # (L, H_kv, k)
        weights = self.score(view)  # (L, H_kv, T)
        for layer_idx in range(len(cache.layers)):
            keys, values = cache.layer_kv(layer_idx)  # (B, H_kv, T, D) as attention reads them
            idx, w = keep[layer_idx].to(keys.device), weights[layer_idx].to(keys.device)
            folded, absorbed = fold(keys[0], values[0], w, idx)  # B == 1
            cache.set_values(layer_idx, folded[None], absorbed)
        return keep
