"""Memory accounting: device statistics and projection of a run onto bigger models.

A 135M demo model holds a few MiB of KV cache, far from any limit.  The projection prices
the *same kept-token counts* on the geometry of a model people actually run on a desktop
card, so the memory chart can show where a full cache would run out of memory and a
policy would not:

    KV bytes per token = 2 (K and V) · layers · kv_heads · head_dim · dtype bytes

at full precision; a quantized KV format (:mod:`thinkviz.core.kvquant`) prices a token at that
format's bytes instead (codes and scales; KIVI at its steady state: a quantized token shares
its key group's scales with 31 others, and the newest ``residual`` tokens, 128 by default, cost
full precision: ``n · slot + min(n, residual) · (full − slot)``).

Weights are counted from the architecture (the parameter count follows from the config);
quantized weights follow bitsandbytes: linear layers at ``bits`` per weight plus their
blockwise scales, embeddings and the LM head kept at 16 bits.

On a GPU the projection can be made real: :func:`set_vram_cap` caps this process's CUDA
memory as if the card had only ``N`` GiB (``torch.cuda.set_per_process_memory_fraction``),
so a full cache really runs out of memory where an evicting policy goes on, and
:func:`with_device_memory` records the device's memory after every step of a run.
"""

from __future__ import annotations

import math
import os
import resource
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from .core.kvquant import KVQuant

GIB = 1024**3

# Consumer card sizes offered for the projection, in GiB of VRAM.
CARDS_GB: tuple[int, ...] = (6, 8, 12, 24)

# bitsandbytes NF4 stores one fp32 absmax per 64-weight block: 32 / 64 = 0.5 extra bits.
# LLM.int8 keeps one scale per row, which is negligible.
_SCALE_BITS = {4: 0.5, 8: 0.0, 16: 0.0}


@dataclass(frozen=True)
class TargetModel:
    """The geometry of a model to price kept tokens on (numbers from its ``config.json``)."""

    name: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    qk_norm: bool = False
    qkv_bias: bool = False
    dtype_bytes: int = 2  # bf16 cache
    family: str = "llama"  # the transformers architecture: "llama", "qwen2" or "qwen3"
    max_context: int = 8192  # max_position_embeddings

    @property
    def bytes_per_token(self) -> int:
        """KV-cache bytes one token costs across all layers (keys and values)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def linear_params(self) -> int:
        """Weights of the decoder's linear layers (what a 4/8-bit loader quantizes)."""
        q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * q + 2 * self.hidden * kv + q * self.hidden
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down
        return self.layers * (attention + mlp)

    @property
    def other_params(self) -> int:
        """Parameters kept at 16 bits: embeddings, LM head, norms, biases."""
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        norms = (2 * self.layers + 1) * self.hidden + (2 * self.layers * self.head_dim if self.qk_norm else 0)
        biases = self.layers * (self.q_heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return embeddings + norms + biases

    @property
    def params(self) -> int:
        return self.linear_params + self.other_params

    @classmethod
    def from_config(cls, name: str, config, dtype_bytes: int = 2) -> TargetModel:
        """The geometry of a model from its transformers config (its text part), e.g. the one a
        user loaded: layers and kv-heads as the config has them (grouped-query attention: the
        cache holds ``num_key_value_heads`` heads), priced in ``dtype_bytes`` per value."""
        text = config.get_text_config()
        q_heads = text.num_attention_heads
        family = text.model_type if text.model_type in ("llama", "qwen2", "qwen3") else "llama"
        return cls(
            name,
            layers=text.num_hidden_layers,
            q_heads=q_heads,
            kv_heads=getattr(text, "num_key_value_heads", None) or q_heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // q_heads,
            hidden=text.hidden_size,
            intermediate=text.intermediate_size,
            vocab=text.vocab_size,
            tied_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
            qk_norm=family == "qwen3",
            qkv_bias=family == "qwen2" or bool(getattr(text, "attention_bias", False)),
            dtype_bytes=dtype_bytes,
            family=family,
            max_context=text.max_position_embeddings,
        )

    def weights_bytes(self, bits: int = 16) -> int:
        """Bytes of the weights with linear layers stored at ``bits`` (4, 8 or 16)."""
        if bits not in _SCALE_BITS:
            raise ValueError(f"weights_bits must be 4, 8 or 16, got {bits}")
        linear = self.linear_params * (bits + _SCALE_BITS[bits]) / 8
        return int(linear + 2 * self.other_params)


# Sources (config.json of each model as published on the Hugging Face hub):
# - Qwen3-4B: github.com/citsjtu2020/LLM-Prof sglang/Model_Config.md, "Qwen3-4B" — 36 layers,
#   32 q / 8 kv heads, head_dim 128, hidden 2560, intermediate 9728, vocab 151936, tied
#   embeddings, bfloat16, 40960 positions (Qwen3 adds q/k RMSNorm per head).
# - DeepSeek-R1-Distill-Qwen-7B: huggingface.co/unsloth/DeepSeek-R1-Distill-Qwen-7B-bnb-4bit and
#   mlfoundations-dev/DeepSeek-R1-Distill-Qwen-7B_OpenThoughts3 config.json (both copies of
#   deepseek-ai's) — Qwen2 architecture, 28 layers, 28 q / 4 kv heads, hidden 3584
#   (head_dim 3584 / 28 = 128), intermediate 18944, vocab 152064, untied, bfloat16, q/k/v bias,
#   131072 positions.
# - Llama-3.1-8B: github.com/citsjtu2020/LLM-Prof sglang/Model_Config.md, "Llama-3.1-8B" —
#   32 layers, 32 q / 8 kv heads, hidden 4096 (head_dim 128), intermediate 14336,
#   vocab 128256, untied, bfloat16, 131072 positions.
TARGETS: dict[str, TargetModel] = {
    t.name: t
    for t in (
        TargetModel(
            "Qwen3-4B",
            layers=36,
            q_heads=32,
            kv_heads=8,
            head_dim=128,
            hidden=2560,
            intermediate=9728,
            vocab=151936,
            tied_embeddings=True,
            qk_norm=True,
            family="qwen3",
            max_context=40960,
        ),
        TargetModel(
            "DeepSeek-R1-Distill-Qwen-7B",
            layers=28,
            q_heads=28,
            kv_heads=4,
            head_dim=128,
            hidden=3584,
            intermediate=18944,
            vocab=152064,
            tied_embeddings=False,
            qkv_bias=True,
            family="qwen2",
            max_context=131072,
        ),
        TargetModel(
            "Llama-3.1-8B",
            layers=32,
            q_heads=32,
            kv_heads=8,
            head_dim=128,
            hidden=4096,
            intermediate=14336,
            vocab=128256,
            tied_embeddings=False,
            max_context=131072,
        ),
    )
}


@dataclass(frozen=True)
class Projection:
    """Kept-token counts priced on ``target`` running on a card with ``card_gb`` GiB of VRAM."""

    target: TargetModel
    card_gb: float
    weights_bits: int = 4

    def __post_init__(self) -> None:
        if self.card_gb <= 0:
            raise ValueError(f"card_gb must be positive, got {self.card_gb}")
        self.target.weights_bytes(self.weights_bits)  # validates weights_bits

    @classmethod
    def named(cls, target: str, card_gb: float, weights_bits: int = 4) -> Projection:
        """Build from a :data:`TARGETS` name; a clear ``ValueError`` for unknown names."""
        try:
            model = TARGETS[target]
        except KeyError:
            raise ValueError(f"unknown projection target {target!r}; choose one of: {', '.join(TARGETS)}") from None
        return cls(model, card_gb, weights_bits)

    def kv_bytes(self, tokens, kv_quant: KVQuant = KVQuant()):
        """KV bytes of ``tokens`` cached tokens on the target stored in ``kv_quant`` (works on
        numbers and numpy arrays; KIVI's full-precision window included)."""
        priced = tokens * self.token_bytes(kv_quant)
        if not kv_quant.spec.grouped:
            return priced
        return priced + np.minimum(tokens, kv_quant.residual) * self.window_extra(kv_quant)

    def token_bytes(self, kv_quant: KVQuant = KVQuant()) -> float:
        """KV bytes of one token on the target in ``kv_quant`` (full precision: an int)."""
        target = self.target
        return target.layers * kv_quant.slot_bytes(target.kv_heads, target.head_dim, target.dtype_bytes)

    def window_extra(self, kv_quant: KVQuant) -> float:
        """What each token of KIVI's full-precision window costs on the target beyond :meth:`token_bytes`."""
        target = self.target
        return target.layers * kv_quant.window_extra_bytes(target.kv_heads, target.head_dim, target.dtype_bytes)

    @property
    def card_bytes(self) -> int:
        return int(self.card_gb * GIB)

    @property
    def weights_bytes(self) -> int:
        return self.target.weights_bytes(self.weights_bits)

    @property
    def available_bytes(self) -> int:
        """VRAM left for the KV cache once the weights are loaded (negative: weights do not fit)."""
        return self.card_bytes - self.weights_bytes

    @property
    def max_tokens(self) -> int:
        """How many tokens of full-precision KV cache fit in :attr:`available_bytes` (0 when nothing fits)."""
        return self.tokens_fitting(KVQuant())

    def tokens_fitting(self, kv_quant: KVQuant) -> int:
        """How many tokens of KV cache in ``kv_quant`` fit in :attr:`available_bytes` (0 when nothing fits)."""
        window = kv_quant.residual * self.window_extra(kv_quant)  # a cache that fits a card is past its window
        return int(max(0, self.available_bytes - window) // self.token_bytes(kv_quant))


def process_rss_bytes() -> int:
    """Resident set size of this process, in bytes (``/proc/self/statm`` or ``getrusage``)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        # getrusage reports the *peak* RSS: kilobytes on Linux, bytes on macOS.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def device_memory(device=None) -> dict[str, int | str]:
    """Memory in use on ``device``: GPU allocated/reserved bytes on CUDA, process RSS otherwise.

    Returns ``{"kind": "cuda", "allocated": …, "reserved": …}`` (plus ``"cap"``, in bytes, while
    :func:`set_vram_cap` holds one) or ``{"kind": "cpu", "rss": …}``.
    """
    dev = torch.device(device) if device is not None else None
    if torch.cuda.is_available() and (dev is None or dev.type == "cuda"):
        stats: dict[str, int | str] = {
            "kind": "cuda",
            "allocated": int(torch.cuda.memory_allocated(dev)),
            "reserved": int(torch.cuda.memory_reserved(dev)),
        }
        cap = vram_cap_bytes(dev)
        if cap is not None:
            stats["cap"] = cap
        return stats
    return {"kind": "cpu", "rss": process_rss_bytes()}


def with_device_memory(events: Iterable, device=None) -> Iterator:
    """Yield each :class:`~thinkviz.core.events.StepEvent` of a run with the device memory measured
    right after its step in ``event.info["device_memory"]`` (what :func:`device_memory` returns),
    so the recording carries ``torch.cuda.memory_allocated`` (or the RSS on a CPU) per step."""
    for event in events:
        event.info["device_memory"] = device_memory(device)
        yield event


# ---- a card you can hit ---------------------------------------------------------------
class VramCapError(ValueError):
    """A VRAM cap that cannot be set: not a positive size, more than the card has, or no GPU."""


def check_vram_cap(cap_gib: float) -> float:
    """``cap_gib`` if it is a positive, finite number of GiB; else :class:`VramCapError`."""
    if isinstance(cap_gib, bool) or not isinstance(cap_gib, (int, float)) or not math.isfinite(cap_gib) or cap_gib <= 0:
        raise VramCapError(f"the VRAM cap must be a positive number of GiB, got {cap_gib!r}")
    return float(cap_gib)


def vram_cap_fraction(cap_gib: float, total_bytes: int) -> float:
    """The share of a card with ``total_bytes`` that a cap of ``cap_gib`` GiB leaves usable."""
    if check_vram_cap(cap_gib) * GIB > total_bytes:
        raise VramCapError(f"the VRAM cap ({cap_gib:g} GiB) is more than this GPU has ({total_bytes / GIB:.1f} GiB)")
    return cap_gib * GIB / total_bytes


def _cuda_device(device):
    """``device`` as a CUDA ``torch.device`` (the current one for ``None``); :class:`VramCapError`
    when there is no GPU or ``device`` is not a CUDA device."""
    if not torch.cuda.is_available():
        raise VramCapError("a VRAM cap needs a CUDA GPU, and this machine has none (it runs on the CPU)")
    dev = torch.device("cuda") if device is None else torch.device(device)
    if dev.type != "cuda":
        raise VramCapError(f"a VRAM cap applies to a CUDA device, not {dev}")
    return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)


def set_vram_cap(cap_gib: float | None, device=None) -> int | None:
    """Make this process see a card of ``cap_gib`` GiB on ``device``: PyTorch's CUDA allocator
    refuses (``torch.OutOfMemoryError``) whatever would take its reserved memory past the cap.

    ``None`` lifts the cap.  Returns the cap in bytes (``None`` when lifted).  The CUDA context
    itself (a few hundred MiB) is not counted, as on a real card it would be.  Raises
    :class:`VramCapError` for a size that is not positive or more than the card has, and
    on a machine without CUDA.
    """
    if cap_gib is not None:
        check_vram_cap(cap_gib)  # a bad size is named before the missing GPU
    dev = _cuda_device(device)
    total = torch.cuda.get_device_properties(dev).total_memory
    fraction = 1.0 if cap_gib is None else vram_cap_fraction(cap_gib, total)
    torch.cuda.set_per_process_memory_fraction(fraction, dev)
    return None if cap_gib is None else vram_cap_bytes(dev)


def vram_cap_bytes(device=None) -> int | None:
    """The cap :func:`set_vram_cap` holds on ``device`` in bytes, or ``None`` (no cap, no GPU, or
    ``device`` is not a CUDA device)."""
    if not torch.cuda.is_available() or (device is not None and torch.device(device).type != "cuda"):
        return None
    dev = _cuda_device(device)
    fraction = torch.cuda.get_per_process_memory_fraction(dev)
    if fraction >= 1.0:
        return None
    return int(fraction * torch.cuda.get_device_properties(dev).total_memory)
