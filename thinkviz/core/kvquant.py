"""KV-cache quantization formats: what each one stores, its torch codec and its byte formula.

A run's :class:`KVQuant` names a format; :mod:`thinkviz.core.cache` keeps each layer's keys and
values in it.  All codecs work on the last axis ``D`` (``head_dim``) of ``(..., D)`` tensors or
on a token axis, never across kv-heads or across tokens that eviction could separate, so the
cache can gather any slot's codes without touching another slot.

- ``none``: the model's own dtype (bf16 / fp16 / fp32), as without quantization.
- ``q8_0`` (llama.cpp ``GGML_TYPE_Q8_0``): blocks of 32 values along ``head_dim``;
  ``d = max|x| / 127`` stored as fp16, codes ``q = roundf(x / d)`` as int8; ``x ≈ q·d``.
  34 bytes per 32 values = 8.5 bits per value.
- ``q4_0`` (llama.cpp ``GGML_TYPE_Q4_0``): blocks of 32; ``m`` = the block's value of largest
  magnitude (with its sign), ``d = m / -8`` (fp16), ``q = min(15, trunc(x / d + 8.5))``,
  ``x ≈ (q - 8)·d``; byte ``j`` of a block holds ``q[j] | q[j + 16] << 4``.  18 bytes per 32
  values = 4.5 bits.  The code range [-8, 7] is lopsided: a value near ``-m`` lands on 7,
  up to one step off; every other value is within half a step.
- ``kivi2`` / ``kivi4`` (KIVI, Liu et al., ICML 2024, arXiv:2402.02750): asymmetric
  ``b``-bit codes, ``scale = (max - min) / (2^b - 1)`` and ``zero = min`` (both fp16),
  ``q = round((x - zero) / scale)``, ``x ≈ q·scale + zero``.  Keys are quantized *per
  channel* over a group of 32 tokens (one scale and zero per channel and group: keys have
  outlier channels); values *per token* over groups of 32 channels.  The newest ``residual``
  tokens (R = 128 by default, KIVI's released code: ``group_size=32, residual_length=128``)
  stay at full precision as a sliding window, keys and values alike: once ``R + 32`` tokens
  are at full precision, the oldest 32 become one key group and their values are quantized,
  so the window holds between ``R`` and ``R + 31`` tokens.  (KIVI's own code slides the value
  window token by token and empties the key window at each flush; here both follow the key
  rule, so every slot is either full precision or codes, K and V alike.)  Codes are packed
  ``8 / b`` to a byte along ``head_dim`` (value ``i`` of a row in byte ``i mod (D·b/8)``, bit
  field ``i div (D·b/8)``).

Quantization is computed in float32 with the stored (fp16) scale, so a value is off by at
most half a step of its block or group, plus the rounding of that fp16 scale and zero point
(and q4_0's one lopsided end).  :func:`round_trip_bound` gives the exact per-element bound the
tests check.  q8_0 / q4_0 follow ggml's reference quantizer (``quantize_row_q8_0_ref`` /
``_q4_0_ref``) to the bit: the tests compare the bytes with ``gguf.quants``, llama.cpp's own
Python package.

Why by hand rather than transformers' ``QuantizedCache`` (optimum-quanto or HQQ backends):
that cache re-quantizes its *whole* content from dequantized values every time its
full-precision residual fills (repeated lossy round trips: exactly the drift this app must not
have), and its backends keep opaque packed tensors (quanto ``QTensor``, HQQ ``(W_q, meta)``)
whose groups run over the flattened cache, so gathering different slots per kv-head would
mean dequantize, gather, quantize again.  Neither offers llama.cpp's block formats (quanto
does 2 and 4 bits only, HQQ's quantizer is an iterative optimiser), and neither is a
dependency here.  The formats above are a few lines of torch each; ``gguf`` (already a
dependency, for the embedded model) checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

BLOCK = 32  # values per q8_0 / q4_0 block and per KIVI value group, along head_dim; tokens per KIVI key group
RESIDUAL = 128  # KIVI's default full-precision window (its released code's residual_length)
FP16_BYTES = 2
GROUP_ID_BYTES = 2  # KIVI: each quantized key slot names its key group (int16)
RESIDUAL_RANGE = (8, 512)


class KVQuantError(ValueError):
    """A KV format or its settings cannot be used; the message says which and why."""


@dataclass(frozen=True)
class KVFormat:
    """What a format is, for docs, the Learn tab and the memory projection."""

    name: str
    bits: int  # bits of one code (16 for none)
    summary: str
    rule: str
    source: str
    grouped: bool = False  # KIVI: keys grouped over tokens, with a full-precision residual

    @property
    def quantized(self) -> bool:
        return self.name != "none"

    def slot_bytes(self, heads: int, head_dim: int, dtype_bytes: int) -> float:
        """Bytes one token costs in one layer (K and V), once quantized.

        Exact for none / q8_0 / q4_0.  For KIVI it is the steady state of a quantized token:
        codes, the value scales and zero points, the key-group id, and a ``1 / 32`` share of its
        key group's scales and zero points (the full-precision window is priced apart:
        :meth:`KVQuant.window_extra_bytes`).
        """
        if not self.quantized:
            return 2 * heads * head_dim * dtype_bytes
        blocks = head_dim // BLOCK
        codes = head_dim * self.bits / 8
        if not self.grouped:
            return 2 * heads * (codes + blocks * FP16_BYTES)
        group_share = 2 * head_dim * FP16_BYTES / BLOCK
        return heads * (2 * codes + blocks * 2 * FP16_BYTES + GROUP_ID_BYTES + group_share)


FORMATS: dict[str, KVFormat] = {
    f.name: f
    for f in (
        KVFormat(
            "none",
            16,
            "Full precision: keys and values in the model's own dtype.",
            "x stored as is (bf16 / fp16 / fp32)",
            "—",
        ),
        KVFormat(
            "q8_0",
            8,
            "8-bit codes, one fp16 scale per block of 32 values: about half the bytes, nearly exact.",
            "d = max|x|/127 (fp16), q = round(x/d) int8, x ≈ q·d; 34 bytes per 32 values (8.5 bits)",
            "llama.cpp GGML_TYPE_Q8_0 (--cache-type-k q8_0)",
        ),
        KVFormat(
            "q4_0",
            4,
            "4-bit codes, one fp16 scale per block of 32 values: under a third of the bytes.",
            "d = m/-8 (m: largest-magnitude value, fp16), q = min(15, ⌊x/d + 8.5⌋), x ≈ (q-8)·d; "
            "18 bytes per 32 values (4.5 bits)",
            "llama.cpp GGML_TYPE_Q4_0 (--cache-type-k q4_0)",
        ),
        KVFormat(
            "kivi2",
            2,
            "2-bit KIVI: keys per channel, values per token, newest tokens at full precision.",
            "scale = (max-min)/3, zero = min (fp16), q = round((x-zero)/scale); keys per channel over "
            "groups of 32 tokens, values per token over 32 channels; the newest `residual` tokens at full precision",
            "KIVI (Liu et al., ICML 2024, arXiv:2402.02750)",
            grouped=True,
        ),
        KVFormat(
            "kivi4",
            4,
            "4-bit KIVI: keys per channel, values per token, newest tokens at full precision.",
            "scale = (max-min)/15, zero = min (fp16), q = round((x-zero)/scale); keys per channel over "
            "groups of 32 tokens, values per token over 32 channels; the newest `residual` tokens at full precision",
            "KIVI (Liu et al., ICML 2024, arXiv:2402.02750)",
            grouped=True,
        ),
    )
}


def format_names() -> list[str]:
    return list(FORMATS)


@dataclass(frozen=True)
class KVQuant:
    """A run's KV-cache format: ``format`` (a :data:`FORMATS` name) and KIVI's ``residual``, the
    newest tokens kept at full precision."""

    format: str = "none"
    residual: int = RESIDUAL

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise KVQuantError(f"unknown KV format {self.format!r}; choose one of: {', '.join(FORMATS)}")
        if not isinstance(self.residual, int) or isinstance(self.residual, bool):
            raise KVQuantError(f"residual must be an integer, got {self.residual!r}")
        low, high = RESIDUAL_RANGE
        if not low <= self.residual <= high:
            raise KVQuantError(f"residual must be between {low} and {high} tokens, got {self.residual}")

    @classmethod
    def parse(cls, text: str, residual: int = RESIDUAL) -> KVQuant:
        """``"q4_0"`` or ``"kivi2"``; a clear :class:`KVQuantError` for anything else."""
        return cls(str(text).strip().lower(), residual)

    @classmethod
    def from_meta(cls, meta: Any) -> KVQuant:
        """The format a recording's ``meta["kv_quant"]`` names: full precision when absent
        (recordings made before formats existed); :class:`KVQuantError` when malformed."""
        if meta is None:
            return cls()
        if not isinstance(meta, dict):
            raise KVQuantError(f"kv_quant must be a mapping, got {type(meta).__name__}")
        return cls(meta.get("format", "none"), meta.get("residual") or RESIDUAL)

    @property
    def spec(self) -> KVFormat:
        return FORMATS[self.format]

    @property
    def label(self) -> str:
        """Short name for tables and legends (``kivi2`` shows a residual other than the default)."""
        if self.spec.grouped and self.residual != RESIDUAL:
            return f"{self.format}/r{self.residual}"
        return self.format

    def check(self, head_dim: int) -> None:
        """:class:`KVQuantError` when the model's ``head_dim`` cannot be stored in this format."""
        if self.spec.quantized and head_dim % BLOCK:
            raise KVQuantError(
                f"{self.format} stores blocks of {BLOCK} values along head_dim; this model's head_dim "
                f"is {head_dim}, not a multiple of {BLOCK}"
            )

    def slot_bytes(self, heads: int, head_dim: int, dtype_bytes: int) -> float:
        """Bytes one token costs in one layer (K and V) in the steady state (see :meth:`KVFormat.slot_bytes`)."""
        return self.spec.slot_bytes(heads, head_dim, dtype_bytes)

    def window_extra_bytes(self, heads: int, head_dim: int, dtype_bytes: int) -> float:
        """What each token of KIVI's full-precision window costs in one layer beyond
        :meth:`slot_bytes` (0 for the other formats): a cache of ``n`` tokens costs
        ``n · slot_bytes + min(n, residual) · window_extra_bytes`` in the steady state."""
        if not self.spec.grouped:
            return 0.0
        return 2 * heads * head_dim * dtype_bytes - self.slot_bytes(heads, head_dim, dtype_bytes)

    def bits_per_value(self, head_dim: int, dtype_bytes: int = 2) -> float:
        """Average stored bits per key or value element of a quantized token (steady state)."""
        return 8 * self.slot_bytes(1, head_dim, dtype_bytes) / (2 * head_dim)

    def quantized_tokens(self, tokens: int) -> int:
        """How many of ``tokens`` consecutive tokens (no eviction) KIVI holds in codes: whole key
        groups of 32, leaving at least ``residual`` at full precision (all of them: other formats)."""
        if not self.spec.grouped:
            return tokens
        return max(0, tokens - self.residual) // BLOCK * BLOCK

    def layer_bytes(self, tokens: int, heads: int, head_dim: int, dtype_bytes: int) -> int:
        """Exact bytes of one layer holding ``tokens`` consecutive tokens (no eviction).

        For KIVI: :meth:`quantized_tokens` of them in ``/ 32`` key groups, the rest in the
        full-precision window.  This is the formula the stored tensors are tested against.
        """
        if not self.spec.grouped:
            return round(tokens * self.slot_bytes(heads, head_dim, dtype_bytes))
        quantized = self.quantized_tokens(tokens)
        full = 2 * heads * head_dim * dtype_bytes
        return round(quantized * self.slot_bytes(heads, head_dim, dtype_bytes) + (tokens - quantized) * full)

    def describe(self) -> dict[str, Any]:
        """For a recording's meta: the format, its code bits and (KIVI) the residual."""
        return {"format": self.format, "bits": self.spec.bits, "residual": self.residual if self.spec.grouped else None}


# ---- codecs -----------------------------------------------------------------------------
def _roundf(x: torch.Tensor) -> torch.Tensor:
    """C's ``roundf`` (half away from zero), written as ggml's reference does it."""
    a = x.abs()
    floored = a.floor()
    return x.sign() * (floored + (2 * (a - floored)).floor())


def _reciprocal(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, 0.0, 1.0 / d)


def q8_0_encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``(..., D)`` → int8 codes ``(..., D)`` and fp16 scales ``(..., D/32)``."""
    blocks = x.float().unflatten(-1, (-1, BLOCK))
    d = blocks.abs().amax(-1, keepdim=True) / 127
    codes = _roundf(blocks * _reciprocal(d)).to(torch.int8)
    return codes.flatten(-2), d.squeeze(-1).to(torch.float16)


def q8_0_decode(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``(..., D)`` from :func:`q8_0_encode`'s output."""
    blocks = codes.unflatten(-1, (-1, BLOCK)).float() * scales.float()[..., None]
    return blocks.flatten(-2)


def q4_0_encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``(..., D)`` → packed uint8 codes ``(..., D/2)`` and fp16 scales ``(..., D/32)``."""
    blocks = x.float().unflatten(-1, (-1, BLOCK))
    largest = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))  # signed
    d = largest / -8
    q = (blocks * _reciprocal(d) + 8.5).trunc().clamp(0, 15).to(torch.uint8)
    half = BLOCK // 2
    packed = q[..., :half] | (q[..., half:] << 4)
    return packed.flatten(-2), d.squeeze(-1).to(torch.float16)


def q4_0_decode(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``(..., D)`` from :func:`q4_0_encode`'s output."""
    blocks = packed.unflatten(-1, (-1, BLOCK // 2))
    q = torch.cat([blocks & 0x0F, blocks >> 4], dim=-1).to(torch.int8) - 8
    return (q.float() * scales.float()[..., None]).flatten(-2)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes ``(..., D)`` of ``bits`` bits → ``(..., D·bits/8)`` bytes (layout in the module docstring)."""
    fields = 8 // bits
    parts = codes.unflatten(-1, (fields, -1))  # (..., fields, D/fields)
    packed = parts[..., 0, :].clone()
    for i in range(1, fields):
        packed |= parts[..., i, :] << (bits * i)
    return packed


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: uint8 ``(..., D)``."""
    mask = (1 << bits) - 1
    return torch.cat([(packed >> (bits * i)) & mask for i in range(8 // bits)], dim=-1)


def asym_encode(x: torch.Tensor, bits: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KIVI's asymmetric codes of ``x`` reduced over ``dim``: uint8 codes (shape of ``x``, not
    packed), fp16 ``scale`` and ``zero`` (``x``'s shape with ``dim`` kept at size 1)."""
    x = x.float()
    low, high = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
    levels = (1 << bits) - 1
    scale, zero = ((high - low) / levels).to(torch.float16), low.to(torch.float16)
    q = ((x - zero.float()) * _reciprocal(scale.float())).round().clamp(0, levels)
    return q.to(torch.uint8), scale, zero


def asym_decode(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """float32 ``codes·scale + zero`` (broadcast)."""
    return codes.float() * scale.float() + zero.float()


def round_trip_bound(x: torch.Tensor, fmt: str, dim: int = -1) -> torch.Tensor:
    """Per-element bound ``(..., D)`` on ``|decode(encode(x)) - x|`` for a block format, or for
    KIVI's asymmetric codes reduced over ``dim``: half a step of the stored scale (one step at
    q4_0's lopsided end), plus the fp16 rounding of scale and zero point (2^-10 of the range's
    largest magnitude covers it)."""
    x = x.float()
    if fmt in ("q8_0", "q4_0"):
        blocks = x.unflatten(-1, (-1, BLOCK))
        amax = blocks.abs().amax(-1, keepdim=True)
        if fmt == "q8_0":
            step = (amax / 127).to(torch.float16).float()
            half = 0.5 * step.expand_as(blocks)
        else:
            largest = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
            d = (largest / -8).to(torch.float16).float()
            lopsided = blocks * _reciprocal(d) > 7.5  # these land on code 15, up to a step away
            half = torch.where(lopsided, 1.0, 0.5) * d.abs()
        return (half + amax * 2**-10).flatten(-2)
    bits = FORMATS[fmt].bits
    low, high = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
    step = ((high - low) / ((1 << bits) - 1)).to(torch.float16).float()
    return (0.5 * step + torch.maximum(low.abs(), high.abs()) * 2**-10).expand_as(x)
