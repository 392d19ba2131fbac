"""EvictingCache: a transformers ``DynamicCache`` whose entries can be physically dropped.

Every layer stores keys and values as ``(B, H_kv, T, D)`` tensors (``B == 1`` here).  Next to
them the cache remembers the *absolute* position of every slot, a table of shape
``(L, H_kv, T)``: after eviction the physical index of a slot no longer equals its position,
so the engine must feed explicit absolute ``position_ids`` to new tokens (their rotary
phase) while the keys already in the cache keep the phase they were written with.

Eviction gathers the kept slots into new, smaller tensors (:meth:`EvictingCache.keep`),
so :meth:`EvictingCache.nbytes` reports memory that really exists.  Different kv-heads of
one layer may keep different positions (per-head policies) but the same *number* of them,
so each layer stays one dense tensor; every layer keeps the same number of slots, which
keeps the causal mask the model builds consistent across layers.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class EvictingCache(DynamicCache):
    """A dynamic KV cache with per-layer, per-kv-head eviction and absolute positions."""

    def __init__(self, config) -> None:
        super().__init__(config=config)
        if any(type(layer) is not DynamicLayer for layer in self.layers):
            raise ValueError("EvictingCache supports full-attention layers only (no sliding or linear layers)")
        self._positions: torch.Tensor | None = None  # (L, H_kv, T) int64, on the CPU

    # ---- growth ----------------------------------------------------------------------
    def record_positions(self, new_positions: torch.Tensor) -> None:
        """Append the absolute positions ``(q,)`` of the tokens just written by a forward pass."""
        layers, heads = len(self.layers), self.layers[0].keys.shape[1]
        block = new_positions.to(torch.long).cpu().expand(layers, heads, -1)  # (L, H_kv, q)
        self._positions = block.clone() if self._positions is None else torch.cat([self._positions, block], -1)

    # ---- eviction --------------------------------------------------------------------
    def keep(self, indices: torch.Tensor) -> None:
        """Keep only the slots ``indices`` ``(L, H_kv, k)`` (physical, sorted per head).

        Keys, values and positions are gathered into new tensors of length ``k``.  When every
        layer and head keeps the same slots (uniform policies) one ``index_select`` per tensor
        does it; otherwise advanced indexing picks ``(H_kv, k)`` slots per layer.
        """
        n_layers, heads, _ = indices.shape
        if n_layers != len(self.layers):
            raise ValueError(f"keep indices cover {n_layers} layers, cache has {len(self.layers)}")
        indices = indices.cpu()
        uniform = bool((indices == indices[:1, :1]).all())
        head_rows = torch.arange(heads)[:, None]  # (H_kv, 1)
        for layer_idx, layer in enumerate(self.layers):
            device = layer.keys.device
            if uniform:
                idx = indices[0, 0].to(device)
                layer.keys = layer.keys.index_select(2, idx)  # (B, H_kv, k, D)
                layer.values = layer.values.index_select(2, idx)
            else:
                rows, idx = head_rows.to(device), indices[layer_idx].to(device)
                layer.keys = layer.keys[:, rows, idx]  # (B, H_kv, k, D)
                layer.values = layer.values[:, rows, idx]
        self._positions = torch.gather(self._positions, 2, indices)

    # ---- accounting ------------------------------------------------------------------
    @property
    def n_slots(self) -> int:
        """Physical length ``T`` (slots per layer and kv-head)."""
        return 0 if self._positions is None else self._positions.shape[-1]

    def nbytes(self) -> int:
        """Bytes of the key and value tensors that exist right now."""
        return sum(
            layer.keys.nbytes + layer.values.nbytes for layer in self.layers if layer.is_initialized
        )

    def position_table(self) -> torch.Tensor:
        """``(L, H_kv, T)`` absolute positions of every slot (do not modify)."""
        return self._positions
