"""Tiny random Llama / Qwen3 models with the SmolLM2 tokenizer: fast, deterministic test models."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from thinkviz.models import cpu_int4
from thinkviz.memory import TargetModel
from thinkviz.models.loading import LoadedModel, embedded_tokenizer

ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}


def tiny_model(
    arch: str = "llama",
    seed: int = 0,
    *,
    layers: int = 2,
    hidden: int = 64,
    q_heads: int = 4,
    kv_heads: int = 2,
    dtype: torch.dtype = torch.float32,
    quantization: str = "none",
    max_context: int = 2048,
) -> LoadedModel:
    """A small randomly initialised Llama or Qwen3 with the SmolLM2 tokenizer.

    Deterministic for a given ``seed`` (the global RNG is left untouched); eager attention,
    on the CPU; ``quantization="4bit"`` packs it with the ``torch-int4`` backend.
    ``kv_heads < q_heads`` gives grouped-query attention.  ``max_context`` is its context
    length (the embedded model's is 8192).
    """
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {sorted(ARCHS)}, not {arch!r}")
    if quantization not in ("none", "4bit"):
        raise ValueError(f"a tiny model is 'none' or '4bit' (torch-int4), not {quantization!r}")
    config_class, model_class = ARCHS[arch]
    tokenizer = embedded_tokenizer()
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=q_heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // q_heads,
        max_position_embeddings=max_context,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="eager",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).to(dtype).eval()
    if quantization == "4bit":
        cpu_int4.quantize_model(model)
    backend = "torch-int4" if quantization == "4bit" else "none"
    return LoadedModel.wrap(model, tokenizer, f"tiny-{arch} (random)", quantization, torch.device("cpu"), backend)


def save_tiny_model(folder: Path, arch: str = "llama", seed: int = 7, hidden: int = 64) -> str:
    """A tiny random model saved as a model folder (weights and tokenizer), so the CLI and Ray
    workers can load it by path; returns the folder as a string.  ``hidden=128`` gives head_dim 32,
    the smallest a quantized KV format can store."""
    loaded = tiny_model(arch, seed=seed, hidden=hidden)
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return str(folder)


# A Qwen3 small enough for CI; the vocabulary is larger than the SmolLM2 tokenizer's, as Qwen3's is.
SMALL = TargetModel(
    "small-qwen3",
    layers=2,
    q_heads=4,
    kv_heads=2,
    head_dim=16,
    hidden=64,
    intermediate=128,
    vocab=50_000,
    tied_embeddings=True,
    qk_norm=True,
    family="qwen3",
    max_context=4096,
)
