"""merge: h2o selection, but an evicted value is folded into its most similar kept slot.

Seed 002 ("layer-wise KV merging": redundant steps are summarised and merged rather than
thrown away); the folding rule follows KV-merging work such as CaM (Zhang et al., ICML 2024)
and D2O (Wan et al., 2024): what an evicted entry contributed is kept, approximately, by the
kept entry it most resembles.

The rule, per layer and kv-head, at each compression:

- keep the same slots as ``h2o`` (attention received per query, plus the ``recent`` window);
- every evicted slot ``e`` picks the kept slot ``j`` whose key is most similar (cosine; ties:
  the earlier physical slot);
- kept values become attention-weighted means:
  ``v_j ← (m_j·v_j + Σ_{e→j} m_e·v_e) / (m_j + Σ_{e→j} m_e)``, where ``m`` is the h2o score
  (attention received ÷ queries that could see the slot, clamped at 0).  If that total weight is
  0 every term counts 1 (a plain mean).

Keys are never changed, so which slot a query attends to stays as before; only what it reads
there changes.  The weight of a kept slot in later merges is its own score again (folded mass
is not carried forward).  Because values change, a step after merging differs from the
full-cache step with the evicted slots masked: the eviction oracle does not apply here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import CacheView
from .h2o import HeavyHitters
from .registry import register


def fold_values(
    keys: torch.Tensor, values: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor
) -> torch.Tensor:
    """Values ``(H_kv, T, D_v)`` after folding every slot not in ``keep`` ``(H_kv, k)`` into its most
    similar kept slot (rule in the module docstring).  ``keys`` ``(H_kv, T, D)``, ``weights``
    ``(H_kv, T)`` ≥ 0.  Slots outside ``keep`` are returned unchanged (they are about to go)."""
    heads, total, _ = keys.shape
    evicted_mask = torch.ones(heads, total, dtype=torch.bool, device=keys.device)
    evicted_mask.scatter_(1, keep, False)
    if not evicted_mask.any():
        return values
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
    numerator = (w_kept[..., None] * v_kept).scatter_add(1, target[..., None].expand_as(v_gone), w_gone[..., None] * v_gone)
    denominator = w_kept.scatter_add(1, target, w_gone)  # (H_kv, k)
    safe = denominator > 0
    merged = torch.where(safe[..., None], numerator / denominator.clamp(min=1e-30)[..., None], v_kept)
    out = v.scatter(1, keep[..., None].expand_as(merged), merged)
    return out.to(values.dtype)


@register
class KVMerge(HeavyHitters):
    """h2o's keep set ``(L, H_kv, k)``; evicted values folded into kept ones (module docstring)."""

    name = "merge"
    summary = "Like h2o, but nothing is simply lost: an evicted value is averaged into the most similar kept entry."
    source = "seed 002 (KV merging; cf. CaM, ICML 2024, and D2O, 2024)"

    def compress(self, view: CacheView, cache) -> torch.Tensor:
        keep = self.select(view)  # (L, H_kv, k)
        weights = self.score(view)  # (L, H_kv, T)
        for layer_idx, layer in enumerate(cache.layers):
            idx, w = keep[layer_idx].to(layer.keys.device), weights[layer_idx].to(layer.keys.device)
            layer.values = torch.stack(  # a new tensor: the cached one may be an inference tensor
                [fold_values(keys, values, w, idx) for keys, values in zip(layer.keys, layer.values)]
            )  # (B, H_kv, T, D_v)
        return keep
