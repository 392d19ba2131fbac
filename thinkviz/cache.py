"""EvictingCache: a transformers ``DynamicCache`` whose entries can be physically dropped.

Every layer stores keys and values as ``(B, H_kv, T, D)`` tensors (``B == 1`` here).  Next to
them the cache remembers the *absolute* position of every slot, ``positions[l]`` of shape
``(H_kv, T)``: after eviction the physical index of a slot no longer equals its position,
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
        self.positions: list[torch.Tensor] = []  # per layer (H_kv, T) int64

    # ---- growth ----------------------------------------------------------------------
    def record_positions(self, new_positions: torch.Tensor) -> None:
        """Append the absolute positions ``(q,)`` of the tokens just written by a forward pass."""
        new_positions = new_positions.to(torch.long).cpu()
        for layer_idx, layer in enumerate(self.layers):
            heads = layer.keys.shape[1]
            block = new_positions.unsqueeze(0).expand(heads, -1)
            if layer_idx < len(self.positions):
                self.positions[layer_idx] = torch.cat([self.positions[layer_idx], block], dim=-1)
            else:
                self.positions.append(block.clone())
        assert all(p.shape[-1] == l.keys.shape[-2] for p, l in zip(self.positions, self.layers))

    # ---- eviction --------------------------------------------------------------------
    def keep(self, indices: torch.Tensor) -> None:
        """Keep only the slots ``indices`` ``(L, H_kv, k)`` (physical, sorted per head).

        Keys, values and positions are gathered into new tensors of length ``k``.
        """
        n_layers, heads, _ = indices.shape
        if n_layers != len(self.layers):
            raise ValueError(f"keep indices cover {n_layers} layers, cache has {len(self.layers)}")
        for layer_idx, layer in enumerate(self.layers):
            idx = indices[layer_idx].to(layer.keys.device)  # (H_kv, k)
            gather = idx[None, :, :, None].expand(layer.keys.shape[0], -1, -1, layer.keys.shape[-1])
            layer.keys = torch.gather(layer.keys, 2, gather)  # (B, H_kv, k, D)
            layer.values = torch.gather(layer.values, 2, gather)
            self.positions[layer_idx] = torch.gather(self.positions[layer_idx], 1, idx.cpu())

    # ---- accounting ------------------------------------------------------------------
    @property
    def n_slots(self) -> int:
        """Physical length ``T`` (slots per layer and kv-head)."""
        return self.positions[0].shape[-1] if self.positions else 0

    def nbytes(self) -> int:
        """Bytes of the key and value tensors that exist right now."""
        return sum(
            layer.keys.nbytes + layer.values.nbytes for layer in self.layers if layer.is_initialized
        )

    def position_table(self) -> torch.Tensor:
        """``(L, H_kv, T)`` absolute positions of every slot."""
        return torch.stack(self.positions)
