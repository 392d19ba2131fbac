"""Random weights in a real geometry, built in code: a real model's memory and speed, no download.

``random:Qwen3-4B`` is Qwen3-4B's architecture as :data:`thinkviz.memory.TARGETS` records it
(36 layers, 32 query / 8 kv heads of 128, a 151936-token vocabulary, tied embeddings) with
randomly initialised weights.  Its KV cache costs what the real model's costs (147456 bytes per
token in bf16), its weights weigh what the real ones weigh and a forward pass does the same
work, so memory charts, out-of-memory points and throughput are real; the text is noise (the
embedded model is the one for text).  Every name it loads under says "random weights".

- ``quantization="none"``: built straight on the device (bf16 on CUDA, float32 on the CPU).
- ``"4bit"`` / ``"8bit"``: the random weights are written to a temporary folder under
  :func:`thinkviz.models.loading.cache_dir` and loaded through :func:`thinkviz.models.loading.load_model`, so
  bitsandbytes quantizes them exactly as it would a downloaded checkpoint.

The tokenizer is the shared SmolLM2 one.  Ids it has no text for (Qwen3's vocabulary is three
times larger) get zero embedding and LM-head rows, so greedy decoding picks tokens that print;
the parameter count and bytes are unchanged.  Rotary settings keep transformers' defaults:
they change no shape, byte or FLOP.
"""

from __future__ import annotations

import dataclasses
import tempfile

import torch
import transformers
from transformers import AutoModelForCausalLM

from ..memory import TARGETS, TargetModel
from .loading import (
    QUANTIZATIONS,
    LoadedModel,
    ModelLoadError,
    Progress,
    _compute_dtype,
    _device,
    first_line,
    cache_dir,
    embedded_tokenizer,
    load_model,
)

PREFIX = "random:"
_FAMILIES = {
    "llama": transformers.LlamaConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
}


def random_names() -> list[str]:
    """The model names this module loads: ``random:`` + each :data:`~thinkviz.memory.TARGETS` name."""
    return [PREFIX + name for name in TARGETS]


def label(target: TargetModel) -> str:
    """What a random-weights model is called wherever it is shown."""
    return f"{target.name} geometry, random weights"


def random_config(
    target: TargetModel, tokenizer: transformers.PreTrainedTokenizerBase
) -> transformers.PretrainedConfig:
    """The transformers config of ``target`` (eager attention, the tokenizer's special ids).

    ``family`` must agree with the extras :class:`~thinkviz.memory.TargetModel` counts: Qwen3
    has q/k norms, Qwen2 q/k/v biases, Llama neither.
    """
    if target.family not in _FAMILIES:
        raise ValueError(f"family must be one of {sorted(_FAMILIES)}, not {target.family!r}")
    if target.qk_norm != (target.family == "qwen3") or target.qkv_bias != (target.family == "qwen2"):
        raise ValueError(
            f"{target.name}: a {target.family} model has qk_norm={target.family == 'qwen3'} "
            f"and qkv_bias={target.family == 'qwen2'}"
        )
    if target.vocab < len(tokenizer):
        raise ValueError(f"{target.name}: vocab {target.vocab} is smaller than the tokenizer ({len(tokenizer)})")
    return _FAMILIES[target.family](
        vocab_size=target.vocab,
        hidden_size=target.hidden,
        intermediate_size=target.intermediate,
        num_hidden_layers=target.layers,
        num_attention_heads=target.q_heads,
        num_key_value_heads=target.kv_heads,
        head_dim=target.head_dim,
        max_position_embeddings=target.max_context,
        tie_word_embeddings=target.tied_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="eager",
    )


def random_model(
    target: TargetModel,
    device: str | torch.device | None = None,
    *,
    dtype: torch.dtype | None = None,
    seed: int = 0,
) -> LoadedModel:
    """``target``'s architecture with random weights, built on ``device`` (default: CUDA when
    available), unquantized, in ``dtype`` (default: bf16 on CUDA, float32 on the CPU).

    Deterministic for a given ``seed`` and device; the global RNG is left untouched.  Raises
    :class:`~thinkviz.models.loading.ModelLoadError` when the device runs out of memory.
    """
    tokenizer = embedded_tokenizer()
    config = random_config(target, tokenizer)
    where = _device(None if device is None else str(device))
    dtype = dtype or _compute_dtype("none", where)
    try:
        with torch.random.fork_rng(devices=[where] if where.type == "cuda" else []), where:
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    except torch.OutOfMemoryError as exc:
        raise ModelLoadError(f"{label(target)} does not fit on {where}: {first_line(exc)}") from exc
    with torch.no_grad():  # rows for ids without text: greedy decoding never picks them
        model.get_input_embeddings().weight[len(tokenizer) :] = 0
        model.get_output_embeddings().weight[len(tokenizer) :] = 0
    return LoadedModel.wrap(model, tokenizer, label(target), "none", where)


def load_random(
    name: str | TargetModel,
    quantization: str = "none",
    device: str | None = None,
    progress: Progress | None = None,
    *,
    seed: int = 0,
    backend: str = "auto",
) -> LoadedModel:
    """Load ``random:<target>`` (see :func:`random_names`) or a given geometry; 4/8-bit through
    the real loader (``backend`` as there).  Raises :class:`~thinkviz.models.loading.ModelLoadError`."""
    report = progress or (lambda fraction, message: None)
    if isinstance(name, TargetModel):
        target = name
    elif name.strip().removeprefix(PREFIX) in TARGETS:
        target = TARGETS[name.strip().removeprefix(PREFIX)]
    else:
        raise ModelLoadError(
            f"Unknown random-weights model {name.strip()!r}; choose one of {', '.join(random_names())}"
        )
    if quantization not in QUANTIZATIONS:
        raise ModelLoadError(f"Unknown quantization {quantization!r}; choose one of {', '.join(QUANTIZATIONS)}")
    if quantization == "none":
        report(0.1, f"Building {label(target)} on {_device(device)}")
        loaded = random_model(target, device, seed=seed)
        report(1.0, f"Ready: {loaded.name}")
        return loaded
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".random-weights-", dir=root) as folder:
        report(0.1, f"Writing {label(target)} (bf16) to a temporary folder for the {quantization} loader")
        built = random_model(target, "cpu", dtype=torch.bfloat16, seed=seed)
        built.model.save_pretrained(folder)
        built.tokenizer.save_pretrained(folder)
        del built
        loaded = load_model(
            folder,
            quantization,
            device,
            progress=lambda fraction, message: report(0.2 + 0.7 * fraction, message),
            backend=backend,
        )
    report(1.0, f"Ready: {label(target)}")
    return dataclasses.replace(loaded, name=label(target))
