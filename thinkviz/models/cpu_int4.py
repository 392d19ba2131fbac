"""The CPU 4-bit backend: PyTorch's own int4 weight-only matmul, weights packed in 4 bits.

Every ``nn.Linear`` of the decoder layers becomes an :class:`Int4Linear`: its weight
``(N, K)`` is quantized per group of :data:`GROUP` consecutive input weights to unsigned
4-bit codes ``q`` with one scale ``s`` and one offset ``z`` per group,
``w ≈ (q - 8) · s + z`` (asymmetric min/max), and stored the way
``torch.ops.aten._weight_int4pack_mm_for_cpu`` reads it: ``(N, K / 2)`` uint8, two codes per
byte, plus ``(K / GROUP, N, 2)`` bfloat16 scales and offsets.  The output head (tied to the
input embedding in most small models) becomes an :class:`Int8Linear`, one int8 per weight
with a scale per output row, read by ``torch.ops.aten._weight_int8pack_mm``; the input
embedding and the norms stay float32.

Both kernels take bfloat16 activations (their float32 path is a scalar fallback ~40x slower,
measured), so each quantized matmul casts its input to bfloat16 and its output back; the rest
of the model (attention, norms, the KV cache) keeps computing in float32, as on the
bitsandbytes path, whose fused CPU kernel also computes in bfloat16.

Why this layout: the embedded SmolLM2 ships as a Q4_1 GGUF, whose blocks are exactly this
(32 consecutive weights, a scale and a minimum; the minimum and maximum of each block are
codes 0 and 15), so min/max quantization in groups of 32 gives its weights back up to the
bfloat16 rounding of scale and offset, where bitsandbytes NF4 quantizes them a second time.
Measurements and the choice against bitsandbytes and torchao are in README and
docs/benchmarks.md (``python -m thinkviz bench quant-speed``).
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 32
KERNELS = ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu", "_weight_int8pack_mm")
_COMPUTE = torch.bfloat16


class Int4Unavailable(RuntimeError):
    """This PyTorch build or CPU cannot run the int4 backend; the message says why."""


def available() -> str | None:
    """``None`` when the int4 backend can run here, else the one-line reason it cannot."""
    missing = [op for op in KERNELS if not hasattr(torch.ops.aten, op)]
    if missing:
        return f"PyTorch {torch.__version__} lacks {', '.join(missing)}"
    return None


def fast_here() -> bool:
    """Whether the int4 kernels are vectorised on this CPU (PyTorch dispatches them for AVX512).

    On AVX2 or without SIMD, PyTorch's int4 kernel runs no faster than float32 (measured with
    ``ATEN_CPU_CAPABILITY=avx2``), so the automatic choice keeps bitsandbytes there.
    """
    return available() is None and torch.backends.cpu.get_cpu_capability().startswith("AVX512")


class Int4Linear(nn.Module):
    """``y = x Wᵀ + b`` with ``W`` packed in 4 bits (shapes in the module docstring)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.out_features, self.in_features = linear.weight.shape
        codes, scale_zero = int4_codes(linear.weight)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))  # (N, K / 2) uint8
        self.register_buffer("scale_zero", scale_zero)  # (K / GROUP, N, 2) bfloat16
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(_COMPUTE)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scale_zero)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 groups of {GROUP}"


class Int8Linear(nn.Module):
    """``y = x Wᵀ + b`` with ``W`` in int8, one bfloat16 scale per output row."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.out_features, self.in_features = linear.weight.shape
        codes, scale = int8_codes(linear.weight)
        self.register_buffer("codes", codes)  # (N, K) int8
        self.register_buffer("scale", scale)  # (N,) bfloat16
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(_COMPUTE)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.codes, self.scale)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per row"


def int4_codes(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, K)`` weight → ``(N, K)`` int32 codes in 0..15 and ``(K / GROUP, N, 2)`` bfloat16 scales/offsets.

    Min/max per group of :data:`GROUP`; scale and offset are rounded to bfloat16 first and the
    codes chosen against the rounded grid.  A constant group gets code 8 and its value as offset.
    """
    n, k = weight.shape
    groups = weight.detach().float().reshape(n, k // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).to(_COMPUTE)
    zero = (low + 8 * scale.float()).to(_COMPUTE)
    step = torch.where(scale > 0, scale.float(), torch.ones_like(low))
    codes = ((groups - zero.float()[..., None]) / step[..., None] + 8).round().clamp(0, 15)
    return codes.reshape(n, k).to(torch.int32), torch.stack([scale.t(), zero.t()], -1).contiguous()


def int8_codes(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, K)`` weight → ``(N, K)`` int8 codes in -127..127 and ``(N,)`` bfloat16 scales (max-abs per row)."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(1) / 127).to(_COMPUTE)
    step = torch.where(scale > 0, scale.float(), torch.ones_like(scale, dtype=torch.float32))
    return (weight / step[:, None]).round().clamp(-127, 127).to(torch.int8), scale


def dequantized_int4(weight: torch.Tensor) -> torch.Tensor:
    """The float32 ``(N, K)`` weight an :class:`Int4Linear` made from ``weight`` computes with."""
    codes, scale_zero = int4_codes(weight)
    scale, zero = (t.t().float().repeat_interleave(GROUP, dim=1) for t in scale_zero.unbind(-1))  # (N, K)
    return (codes.float() - 8) * scale + zero


def dequantized_int8(weight: torch.Tensor) -> torch.Tensor:
    """The float32 ``(N, K)`` weight an :class:`Int8Linear` made from ``weight`` computes with."""
    codes, scale = int8_codes(weight)
    return codes.float() * scale.float()[:, None]


def fits(linear: nn.Linear) -> bool:
    """Whether the kernels take ``linear``'s shape: input features a multiple of :data:`GROUP`,
    output features a multiple of 16 (the int4 packing's tile)."""
    return linear.in_features % GROUP == 0 and linear.out_features % 16 == 0


def quantize_model(model: nn.Module) -> int:
    """Swap a causal LM's decoder linears for :class:`Int4Linear` and its head for :class:`Int8Linear`, in place.

    Linears whose shape the kernels cannot take stay float.  Returns the number of 4-bit
    linears.  Raises :class:`Int4Unavailable` where the kernels are missing.
    """
    reason = available()
    if reason is not None:
        raise Int4Unavailable(reason)
    count = 0
    with torch.no_grad():
        for layer in model.model.layers:
            for parent in list(layer.modules()):
                for name, child in list(parent.named_children()):
                    if isinstance(child, nn.Linear) and fits(child):
                        setattr(parent, name, Int4Linear(child))
                        count += 1
        head = model.get_output_embeddings()
        if isinstance(head, nn.Linear) and fits(head):
            model.set_output_embeddings(Int8Linear(head))
    return count
