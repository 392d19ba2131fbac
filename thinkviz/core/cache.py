"""EvictingCache: a transformers ``DynamicCache`` whose entries can be physically dropped,
stored at full precision or in a quantized format (:mod:`thinkviz.core.kvquant`).

Every layer holds ``(B, H_kv, T, D)`` keys and values (``B == 1`` here), in slots.  Next to them
the cache remembers the *absolute* position of every slot, a table of shape ``(L, H_kv, T)``:
after eviction the physical index of a slot no longer equals its position, so the engine must
feed explicit absolute ``position_ids`` to new tokens (their rotary phase) while the keys
already in the cache keep the phase they were written with.

Eviction gathers the kept slots into new, smaller tensors (:meth:`EvictingCache.keep`), so
:meth:`EvictingCache.nbytes` reports memory that really exists.  A *dense* keep set (indices
``(L, H_kv, k)``) leaves every layer and kv-head with ``k`` slots: one mask serves all layers.
A *ragged* keep set (a mask ``(L, H_kv, T)`` whose counts differ) gives each layer its own
length ``T_l``, the most any of its heads keeps, and pads the heads that keep fewer with slots
they no longer hold (:func:`ragged_layout`).  The position table is then ``(L, H_kv, W)``,
``W = max T_l``, and :meth:`EvictingCache.valid_table` marks which entries hold a token; the
engine hides the rest from attention with one mask per layer.  Padding is real memory and
:meth:`EvictingCache.nbytes` counts it; :meth:`EvictingCache.logical_nbytes` counts only the
slots that hold a token.

**Per-layer storage.**  Each layer is a *store*: a transformers cache layer with this small
interface, and the only code that knows how K and V are laid out in memory:

- ``update(keys, values)`` (called by the model) writes a forward's new ``(B, H_kv, q, D)``
  entries and returns what attention reads: every stored slot as the format gives it back,
  followed by the ``q`` new entries *at full precision* (a token reads itself exactly in the
  pass that writes it, as in transformers' own quantized cache; later passes read it stored);
- ``gather(indices)`` keeps the physical slots ``(H_kv, k)`` (sorted per head) of every
  per-slot tensor it owns — quantized codes are copied, never re-quantized;
- ``kv()`` → ``(keys, values)`` ``(B, H_kv, T, D)`` exactly as attention reads them;
- ``set_values(values, rows)`` stores new values for the slots marked in ``rows`` ``(H_kv, T)``
  (a value-modifying policy such as ``merge``); a quantized store re-encodes just those rows;
- ``nbytes()`` the bytes of every tensor it holds; ``full_slot_bytes()`` what one slot costs at
  full precision.

Stores: :class:`DenseStore` (``none``; transformers' ``DynamicLayer``, whose update is used
unchanged, so that path is bit-identical to a plain ``DynamicCache``), :class:`BlockStore`
(``q8_0`` / ``q4_0``: per token, per block of 32 channels) and :class:`KiviStore` (``kivi2`` /
``kivi4``: key groups over tokens plus a full-precision residual; its own docstring says how it
stays dense when kv-heads evict differently).

Extending: everything a slot carries *in its format* lives in its store, and ``gather`` moves
it, so a new per-slot tensor of the format is one more field gathered with the others; the
stores take any ``k`` per call, so layers of different lengths need nothing from them.

**Per-slot attention biases.**  A cache made with ``bias_device`` (the attention-matching
policies) also holds an additive attention bias for every slot, ``(L, H_kv, W)`` float32 on
that device, beside the position table and laid out like it: new tokens get 0, ``keep``
gathers it with the same index, :meth:`EvictingCache.set_bias` rewrites a layer's row, and
:meth:`EvictingCache.nbytes` counts it.  It is independent of the storage format (biases stay
float32 next to any codes), so every format composes with it.  Without ``bias_device`` there
is no bias tensor at all and nothing changes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, DynamicLayer

from .kvquant import (
    BLOCK,
    KVQuant,
    asym_decode,
    asym_encode,
    pack_codes,
    q4_0_decode,
    q4_0_encode,
    q8_0_decode,
    q8_0_encode,
    unpack_codes,
)


@functools.lru_cache(maxsize=256)
def _row_starts(heads: int, length: int, device: torch.device) -> torch.Tensor:
    """``(H_kv, 1)`` where each kv-head's row of ``length`` slots starts when the rows are laid end to
    end (kept: a decode step gathers every layer with the same ones)."""
    return torch.arange(heads, device=device)[:, None] * length


def _flat_slots(indices: torch.Tensor, length: int) -> torch.Tensor:
    """``(H_kv·k,)`` the slots ``indices`` ``(H_kv, k)`` of rows of ``length`` slots, numbered over the
    rows laid end to end (kv-head ``h``'s slot ``t`` is ``h·length + t``)."""
    return (indices + _row_starts(indices.shape[0], length, indices.device)).flatten()


def _gather_slots(tensor: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Slots ``flat`` (:func:`_flat_slots`) of ``tensor`` ``(B, H_kv, T, ...)``: ``(B, H_kv, k, ...)``.
    One ``index_select`` over the (kv-head, slot) axes whether or not the heads keep the same slots."""
    heads = tensor.shape[1]
    picked = tensor.flatten(1, 2).index_select(1, flat.to(tensor.device))  # (B, H_kv·k, ...)
    return picked.unflatten(1, (heads, flat.shape[0] // heads))


def _put_rows(tensor: torch.Tensor, rows: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` ``(1, H_kv, T, ...)`` with the marked ``rows`` ``(H_kv, T)`` replaced
    by ``new`` ``(n, ...)`` (out of place: the cached tensor may be an inference tensor)."""
    out = tensor.clone()
    out[0][rows.to(tensor.device)] = new.to(tensor.dtype)
    return out


class DenseStore(DynamicLayer):
    """``none``: keys and values ``(B, H_kv, T, D)`` as the model wrote them."""

    def gather(self, indices: torch.Tensor) -> None:
        flat = _flat_slots(indices, self.keys.shape[2])
        self.keys = _gather_slots(self.keys, flat)  # (B, H_kv, k, D)
        self.values = _gather_slots(self.values, flat)

    def kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys, self.values

    def set_values(self, values: torch.Tensor, rows: torch.Tensor) -> None:
        """At full precision the new tensor is stored whole (``rows`` are for quantized stores)."""
        self.values = values.to(self.values.dtype)

    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes if self.is_initialized else 0

    def full_slot_bytes(self) -> int:
        return 2 * self.keys.shape[1] * self.keys.shape[3] * self.keys.element_size() if self.is_initialized else 0


class QuantizedStore(CacheLayerMixin):
    """Shared bookkeeping of the quantized stores: the model's dtype and device, the slot
    count, and the read-then-append ``update`` described in the module docstring."""

    is_sliding = False

    def __init__(self, kv_quant: KVQuant) -> None:
        super().__init__()
        self.kv_quant = kv_quant
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.heads, self.head_dim = key_states.shape[1], key_states.shape[3]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._start(key_states.shape[0])
        if self.length:
            old_keys, old_values = self.kv()
            keys, values = torch.cat([old_keys, key_states], dim=-2), torch.cat([old_values, value_states], dim=-2)
        else:
            keys, values = key_states, value_states
        self._append(key_states, value_states)
        self.length += key_states.shape[-2]
        return keys, values

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def full_slot_bytes(self) -> int:
        if not self.is_initialized:
            return 0
        return 2 * self.heads * self.head_dim * self.dtype.itemsize

    def _start(self, batch: int) -> None:
        raise NotImplementedError

    def _append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        raise NotImplementedError

    def _empty(self, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(rows, self.heads, 0, width, dtype=dtype, device=self.device)


class BlockStore(QuantizedStore):
    """``q8_0`` / ``q4_0``: every slot of K and of V is ``D / 32`` llama.cpp blocks.

    Keys and values share two tensors, keys in batch row 0 and values in row 1 (one encode, one
    decode and one gather per tensor instead of two): ``codes`` ``(2, H_kv, T, D)`` int8 (q8_0)
    or ``(2, H_kv, T, D/2)`` uint8, two codes a byte (q4_0); ``scales`` ``(2, H_kv, T, D/32)``
    fp16.  A slot depends on nothing but its own row, so gathering and rewriting rows are exact.
    """

    def __init__(self, kv_quant: KVQuant) -> None:
        super().__init__(kv_quant)
        codec = (q8_0_encode, q8_0_decode) if kv_quant.format == "q8_0" else (q4_0_encode, q4_0_decode)
        self.encode, self.decode = codec

    def _start(self, batch: int) -> None:
        if batch != 1:
            raise ValueError("the quantized stores hold one sequence (batch 1)")
        width = self.head_dim if self.kv_quant.format == "q8_0" else self.head_dim // 2
        self.codes = self._empty(2, width, torch.int8 if self.kv_quant.format == "q8_0" else torch.uint8)
        self.scales = self._empty(2, self.head_dim // BLOCK, torch.float16)

    def _append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        codes, scales = self.encode(torch.cat([keys, values]))  # (2, H_kv, q, ...)
        self.codes = torch.cat([self.codes, codes], dim=2)
        self.scales = torch.cat([self.scales, scales], dim=2)

    def gather(self, indices: torch.Tensor) -> None:
        flat = _flat_slots(indices, self.codes.shape[2])
        self.codes = _gather_slots(self.codes, flat)
        self.scales = _gather_slots(self.scales, flat)
        self.length = indices.shape[-1]

    def kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        decoded = self.decode(self.codes, self.scales).to(self.dtype)  # (2, H_kv, T, D)
        return decoded[:1], decoded[1:]

    def set_values(self, values: torch.Tensor, rows: torch.Tensor) -> None:
        codes, scales = self.encode(values[0][rows.to(values.device)])  # (n, ...) the marked rows only
        self.codes = torch.cat([self.codes[:1], _put_rows(self.codes[1:], rows, codes)])
        self.scales = torch.cat([self.scales[:1], _put_rows(self.scales[1:], rows, scales)])

    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes if self.is_initialized else 0


class KiviStore(QuantizedStore):
    """``kivi2`` / ``kivi4``: ``Tq`` quantized slots followed by a full-precision window of the
    ``Tr`` newest slots, ``T = Tq + Tr`` (``residual ≤ Tr < residual + 32`` once that many tokens
    have come, fewer after an eviction took some of them).

    Tensors, ``b`` bits, ``P = D·b/8`` bytes of packed codes per row:

    - ``k_codes`` ``(B, H_kv, Tq, P)`` uint8; ``k_group`` ``(B, H_kv, Tq)`` int16, the key group of
      each slot; ``k_scale`` / ``k_zero`` ``(B, H_kv, G, D)`` fp16, one per channel and group;
    - ``v_codes`` ``(B, H_kv, Tq, P)`` uint8; ``v_scale`` / ``v_zero`` ``(B, H_kv, Tq, D/32)`` fp16;
    - ``k_tail`` / ``v_tail`` ``(B, H_kv, Tr, D)`` in the model's dtype.

    When the tail holds ``residual + 32`` tokens its oldest 32 become one key group (per channel
    over those tokens) and their values are quantized per token (KIVI's defaults: groups of 32,
    a window of 128; :mod:`thinkviz.core.kvquant`).  Eviction copies codes and group
    ids; a key group whose slots are all gone in every head is dropped, one that some head still
    uses stays (scattered keep sets leave many small groups: the cost is counted, not hidden).
    If a compression would leave the kv-heads of a layer with different numbers of quantized
    slots (they then disagree on how many tail slots they keep), the tail is first quantized as
    one short group, so the layer stays dense; policies that always keep a ``recent`` window of
    at least ``residual + 32`` tokens never trigger this, and one whose heads evict differently
    inside the window shortens it (the flush is counted in the bytes, not hidden).
    """

    def _start(self, batch: int) -> None:
        bits, blocks = self.kv_quant.spec.bits, self.head_dim // BLOCK
        packed = self.head_dim * bits // 8
        self.k_codes, self.v_codes = (self._empty(batch, packed, torch.uint8) for _ in range(2))
        self.k_group = torch.empty(batch, self.heads, 0, dtype=torch.int16, device=self.device)
        self.k_scale, self.k_zero = (self._empty(batch, self.head_dim, torch.float16) for _ in range(2))
        self.v_scale, self.v_zero = (self._empty(batch, blocks, torch.float16) for _ in range(2))
        self.k_tail, self.v_tail = (self._empty(batch, self.head_dim, self.dtype) for _ in range(2))

    @property
    def quantized_slots(self) -> int:
        return self.k_codes.shape[2]

    def _append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.k_tail = torch.cat([self.k_tail, keys], dim=2)
        self.v_tail = torch.cat([self.v_tail, values], dim=2)
        count = self.kv_quant.quantized_tokens(self.k_tail.shape[2])  # whole groups beyond the window
        if count:
            self._flush(count, BLOCK)

    def _flush(self, count: int, group_size: int) -> None:
        """Quantize the tail's first ``count`` slots as ``count / group_size`` key groups."""
        bits, groups = self.kv_quant.spec.bits, count // group_size
        keys, values = self.k_tail[:, :, :count], self.v_tail[:, :, :count]
        batch = keys.shape[0]
        grouped = keys.unflatten(2, (groups, group_size))  # (B, H, g, n, D)
        k_codes, k_scale, k_zero = asym_encode(grouped, bits, dim=3)  # scale (B, H, g, 1, D)
        first = self.k_scale.shape[2]
        ids = torch.arange(first, first + groups, device=self.device, dtype=torch.int16)
        self.k_codes = torch.cat([self.k_codes, pack_codes(k_codes.flatten(2, 3), bits)], dim=2)
        self.k_group = torch.cat([self.k_group, ids.repeat_interleave(group_size).expand(batch, self.heads, -1)], dim=2)
        self.k_scale = torch.cat([self.k_scale, k_scale.squeeze(3)], dim=2)
        self.k_zero = torch.cat([self.k_zero, k_zero.squeeze(3)], dim=2)
        v_codes, v_scale, v_zero = self._encode_values(values)
        self.v_codes = torch.cat([self.v_codes, v_codes], dim=2)
        self.v_scale = torch.cat([self.v_scale, v_scale], dim=2)
        self.v_zero = torch.cat([self.v_zero, v_zero], dim=2)
        self.k_tail, self.v_tail = self.k_tail[:, :, count:], self.v_tail[:, :, count:]

    def _encode_values(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per token over groups of 32 channels: packed codes ``(..., P)``, scale and zero ``(..., D/32)``."""
        bits = self.kv_quant.spec.bits
        codes, scale, zero = asym_encode(values.unflatten(-1, (-1, BLOCK)), bits, dim=-1)
        return pack_codes(codes.flatten(-2), bits), scale.squeeze(-1), zero.squeeze(-1)

    def _decode_values(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
        unpacked = unpack_codes(codes, self.kv_quant.spec.bits).unflatten(-1, (-1, BLOCK))
        return asym_decode(unpacked, scale[..., None], zero[..., None]).flatten(-2)

    def kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        codes = unpack_codes(self.k_codes, self.kv_quant.spec.bits)  # (B, H, Tq, D)
        index = self.k_group.long()[..., None].expand(-1, -1, -1, self.head_dim)
        keys = asym_decode(codes, self.k_scale.gather(2, index), self.k_zero.gather(2, index))
        values = self._decode_values(self.v_codes, self.v_scale, self.v_zero)
        return (
            torch.cat([keys.to(self.dtype), self.k_tail], dim=2),
            torch.cat([values.to(self.dtype), self.v_tail], dim=2),
        )

    def gather(self, indices: torch.Tensor) -> None:
        quantized = (indices < self.quantized_slots).sum(-1)  # (H_kv,)
        if bool((quantized != quantized[0]).any()):
            self._flush(self.k_tail.shape[2], self.k_tail.shape[2])  # a short group: see the class docstring
            quantized = (indices < self.quantized_slots).sum(-1)
        split = int(quantized[0])
        head_idx, tail_idx = indices[:, :split], indices[:, split:] - self.quantized_slots
        head_flat = _flat_slots(head_idx, self.quantized_slots)
        tail_flat = _flat_slots(tail_idx, self.k_tail.shape[2])
        for name in ("k_codes", "k_group", "v_codes", "v_scale", "v_zero"):
            setattr(self, name, _gather_slots(getattr(self, name), head_flat))
        self.k_tail = _gather_slots(self.k_tail, tail_flat)
        self.v_tail = _gather_slots(self.v_tail, tail_flat)
        self._drop_dead_groups()
        self.length = indices.shape[-1]

    def _drop_dead_groups(self) -> None:
        groups = self.k_scale.shape[2]
        live = torch.unique(self.k_group)  # sorted
        if len(live) == groups:
            return
        renumber = torch.full((groups,), -1, dtype=torch.int16, device=self.device)
        renumber[live.long()] = torch.arange(len(live), dtype=torch.int16, device=self.device)
        self.k_group = renumber[self.k_group.long()]
        self.k_scale = self.k_scale.index_select(2, live.long())
        self.k_zero = self.k_zero.index_select(2, live.long())

    def set_values(self, values: torch.Tensor, rows: torch.Tensor) -> None:
        split = self.quantized_slots
        head_rows, tail_rows = rows[:, :split], rows[:, split:]
        if bool(head_rows.any()):
            codes, scale, zero = self._encode_values(values[0, :, :split][head_rows.to(values.device)])
            self.v_codes = _put_rows(self.v_codes, head_rows, codes)
            self.v_scale = _put_rows(self.v_scale, head_rows, scale)
            self.v_zero = _put_rows(self.v_zero, head_rows, zero)
        if bool(tail_rows.any()):
            self.v_tail = _put_rows(self.v_tail, tail_rows, values[0, :, split:][tail_rows.to(values.device)])

    def nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        names = ("k_codes", "k_group", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero", "k_tail", "v_tail")
        return sum(getattr(self, name).nbytes for name in names)


def make_store(kv_quant: KVQuant) -> CacheLayerMixin:
    """The store of one layer in ``kv_quant``'s format."""
    if not kv_quant.spec.quantized:
        return DenseStore()
    return KiviStore(kv_quant) if kv_quant.spec.grouped else BlockStore(kv_quant)


class LayerKeys(Sequence):
    """Every layer's keys ``(B, H_kv, T, D)`` as attention reads them, decoded when asked for."""

    def __init__(self, layers: list) -> None:
        self._layers = layers

    def __len__(self) -> int:
        return len(self._layers)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self._layers[index].kv()[0]


def ragged_layout(mask: torch.Tensor, lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Physical slots for a ragged keep mask ``(L, H_kv, T)`` over layers of ``lengths`` slots.

    Layer ``l`` keeps ``T_l = max_h count(l, h)`` slots in every head: a head that keeps fewer is
    padded with its lowest-numbered slots it does not keep, so each head's slots stay in physical
    (and so in position) order.  Returns ``index`` ``(L, H_kv, W)``, the old slot each new slot
    comes from (``W = max T_l``; 0 past a layer's end), and ``valid`` ``(L, H_kv, W)``, which of
    them hold a kept token.
    """
    layers, heads, _ = mask.shape
    counts = mask.sum(-1)  # (L, H_kv)
    width = int(counts.max())
    index = torch.zeros(layers, heads, width, dtype=torch.long)
    valid = torch.zeros(layers, heads, width, dtype=torch.bool)
    for layer, length in enumerate(lengths):
        kept = mask[layer, :, :length]
        size = int(counts[layer].max())
        spare = ~kept
        chosen = kept | spare & (spare.cumsum(-1) <= (size - counts[layer])[:, None])
        columns = chosen.nonzero()[:, 1].view(heads, size)  # row-major: sorted per head
        index[layer, :, :size] = columns
        valid[layer, :, :size] = kept.gather(-1, columns)
    return index, valid


class EvictingCache(DynamicCache):
    """A dynamic KV cache with per-layer, per-kv-head eviction, absolute positions and a storage format."""

    def __init__(self, config, kv_quant: KVQuant = KVQuant(), bias_device: torch.device | str | None = None) -> None:
        super().__init__(config=config)
        if any(type(layer) is not DynamicLayer for layer in self.layers):
            raise ValueError("EvictingCache supports full-attention layers only (no sliding or linear layers)")
        self.kv_quant = kv_quant
        self.layers = [make_store(kv_quant) for _ in self.layers]
        text = config.get_text_config(decoder=True)
        self.kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        self._positions: torch.Tensor | None = None  # (L, H_kv, W) int64, on the CPU
        self._valid: torch.Tensor | None = None  # (L, H_kv, W) bool once ragged; None while dense
        self.bias_device = None if bias_device is None else torch.device(bias_device)
        self._bias: torch.Tensor | None = None  # (L, H_kv, W) float32 on bias_device, when biased

    # ---- growth ----------------------------------------------------------------------
    def record_positions(self, new_positions: torch.Tensor) -> None:
        """Append the absolute positions ``(q,)`` of the tokens just written by a forward pass
        (a ragged cache writes each layer's new tokens after that layer's own slots)."""
        block = new_positions.to(torch.long).cpu().expand(len(self.layers), self.kv_heads, -1)  # (L, H_kv, q)
        if self._positions is None:
            self._positions = block.clone()
            columns = None
        elif self._valid is None:
            self._positions = torch.cat([self._positions, block], -1)
            columns = None
        else:
            q = block.shape[-1]
            ends = torch.tensor(self.lengths()) - q  # each layer's length before this forward
            columns = (ends[:, None] + torch.arange(q))[:, None, :].expand_as(block)  # (L, H_kv, q)
            self._positions = torch.cat([self._positions, torch.zeros_like(block)], -1).scatter(2, columns, block)
            grown = torch.cat([self._valid, torch.zeros(block.shape, dtype=torch.bool)], -1)
            self._valid = grown.scatter(2, columns, True)
        if self.bias_device is not None:
            self._grow_bias(block.shape, columns)

    def _grow_bias(self, shape: torch.Size, columns: torch.Tensor | None) -> None:
        """New tokens' bias is 0: appended columns (dense) or the columns they were written to (ragged,
        which may be a shorter layer's former padding)."""
        zeros = torch.zeros(shape, device=self.bias_device)
        if self._bias is None:
            self._bias = zeros
            return
        self._bias = torch.cat([self._bias, zeros], -1)
        if columns is not None:
            self._bias = self._bias.scatter(2, columns.to(self.bias_device), 0.0)

    # ---- eviction --------------------------------------------------------------------
    def keep(self, keep: torch.Tensor) -> torch.Tensor:
        """Keep the slots ``keep``: indices ``(L, H_kv, k)`` (physical, sorted per head; dense) or a
        keep mask ``(L, H_kv, W)`` bool (ragged, laid out by :func:`ragged_layout`).

        Each layer's store gathers its own tensors (one ``index_select`` per tensor over its
        (kv-head, slot) axes); positions follow.  Returns the
        ``(L, H_kv, W')`` old slot of every new one, for statistics that move with the slots.  A
        mask that keeps the same count everywhere leaves the cache dense.
        """
        n_layers = keep.shape[0]
        if n_layers != len(self.layers):
            raise ValueError(f"keep indices cover {n_layers} layers, cache has {len(self.layers)}")
        keep = keep.cpu()
        if keep.dtype == torch.bool:
            index, valid = ragged_layout(keep, self.lengths())
            sizes = keep.sum(-1).amax(-1).tolist()  # each layer's new length T_l
            valid = None if bool(valid.all()) else valid
        else:
            index, valid, sizes = keep, None, [keep.shape[-1]] * n_layers
        for layer, layer_index, size in zip(self.layers, index, sizes):
            layer.gather(layer_index[:, :size])
        self._positions = torch.gather(self._positions, 2, index)
        if self._bias is not None:
            self._bias = torch.gather(self._bias, 2, index.to(self.bias_device))
        self._valid = valid
        return index

    # ---- contents ----------------------------------------------------------------------
    def layer_kv(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(B, H_kv, T, D)`` of one layer, as attention reads them."""
        return self.layers[layer_idx].kv()

    def key_views(self) -> LayerKeys:
        """Every layer's keys as attention reads them (quantized formats decode on access)."""
        return LayerKeys(self.layers)

    def set_values(self, layer_idx: int, values: torch.Tensor, rows: torch.Tensor) -> None:
        """Store ``values`` ``(B, H_kv, T, D)`` for the slots marked in ``rows`` ``(H_kv, T)`` of one layer."""
        self.layers[layer_idx].set_values(values, rows)

    def bias_table(self) -> torch.Tensor | None:
        """``(L, H_kv, W)`` float32 every slot's attention bias, ``None`` for a cache without biases."""
        return self._bias

    def layer_bias(self, layer_idx: int) -> torch.Tensor | None:
        """``(H_kv, T_l)`` the bias of one layer's slots as attention adds it (``None`` without biases)."""
        if self._bias is None:
            return None
        return self._bias[layer_idx, :, : self.layers[layer_idx].get_seq_length()]

    def set_bias(self, layer_idx: int, bias: torch.Tensor) -> None:
        """Store ``bias`` ``(H_kv, T_l)`` for one layer's slots (out of place: the table may be an
        inference tensor)."""
        if self._bias is None:
            raise ValueError("this cache holds no attention biases (make it with bias_device)")
        length, held = bias.shape[-1], self.layers[layer_idx].get_seq_length()
        if length != held:
            raise ValueError(f"layer {layer_idx} holds {held} slots, got {length} biases")
        table = self._bias.clone()
        table[layer_idx, :, :length] = bias.to(table)
        self._bias = table

    # ---- accounting ------------------------------------------------------------------
    @property
    def n_slots(self) -> int:
        """Physical length ``T`` (slots per layer and kv-head); a ragged cache's longest layer, ``W``."""
        return 0 if self._positions is None else self._positions.shape[-1]

    @property
    def ragged(self) -> bool:
        """Whether layers differ in length or heads are padded (then :meth:`valid_table` is set)."""
        return self._valid is not None

    def lengths(self) -> list[int]:
        """Each layer's physical length ``T_l``."""
        return [layer.get_seq_length() for layer in self.layers]

    def kept_counts(self) -> torch.Tensor:
        """``(L, H_kv)`` tokens each layer and kv-head holds (its logical length)."""
        if self._valid is None:
            return torch.full((len(self.layers), self.kv_heads), self.n_slots)
        return self._valid.sum(-1)

    def mean_kept(self) -> float:
        """Tokens held per layer and kv-head, on average (``T`` for a dense cache)."""
        return float(self.n_slots) if self._valid is None else float(self._valid.sum(-1).float().mean())

    def logical_nbytes(self) -> int:
        """:meth:`nbytes` without the padding: each layer's bytes times the share of its slots
        that hold a token (every slot of a layer costs the same)."""
        if self._valid is None:
            return self.nbytes()
        held = self.kept_counts().sum(-1).tolist()  # (L,)
        stores = sum(
            layer.nbytes() * kept / max(1, self.kv_heads * length)
            for layer, kept, length in zip(self.layers, held, self.lengths())
        )
        return int(stores + sum(held) * self._bias_slot_bytes())

    def valid_table(self) -> torch.Tensor | None:
        """``(L, H_kv, W)`` bool, which entries of :meth:`position_table` hold a token; ``None`` while
        the cache is dense (all of them)."""
        return self._valid

    def nbytes(self) -> int:
        """Bytes of every tensor the layers hold right now (codes, scales, zero points, residual),
        and the bias table when there is one."""
        bias = 0 if self._bias is None else self._bias.nbytes
        return sum(layer.nbytes() for layer in self.layers) + bias

    def _bias_slot_bytes(self) -> int:
        return 0 if self._bias is None else self._bias.element_size()

    def full_precision_nbytes(self, tokens: int) -> int:
        """Bytes ``tokens`` slots per layer would take at the model's own precision, nothing evicted."""
        return tokens * sum(layer.full_slot_bytes() for layer in self.layers)

    def position_table(self) -> torch.Tensor:
        """``(L, H_kv, T)`` absolute positions of every slot (do not modify)."""
        return self._positions
