"""What a GGUF file holds, read from its header alone: architecture, geometry, quantization.

GGUF (llama.cpp's single-file format) opens with key/value metadata
(``general.architecture``, ``<arch>.block_count``, ``<arch>.attention.head_count_kv``, the
tokenizer and its chat template) and a table of tensors, each with its type (``F16``,
``Q4_K``, ``Q8_0``...) and offset; the weights follow.  :func:`read_info` reads the header
(:mod:`.gguf_header`: the weights and the tokenizer's long tables are not read) and checks, before any
slow conversion, what transformers' GGUF support can load: its architecture, every tensor's
type, and that the file holds every byte its table promises (a download cut short fails
here, in one line).

The KV geometry comes from the same keys llama.cpp reads (grouped-query attention: the
cache holds ``head_count_kv`` heads, not ``head_count``), so a model can be priced before it
is loaded.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import math
import os
import pathlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

from .gguf_header import GGUFHeader, HeaderError, TensorEntry, read_header

_CHUNK = 1 << 24
_ADDRESSED = re.compile(r"sha256-([0-9a-f]{64})")


class GGUFError(ValueError):
    """A GGUF file cannot be loaded; the message is one line naming the file and the reason."""


@dataclass(frozen=True)
class GGUFInfo:
    """A GGUF file's header: name, architecture, quantization and the KV geometry.

    ``quantization`` is the file type llama.cpp wrote (``Q4_K_M``), or the most common
    tensor type when the file names none.  ``kv_heads`` is the per-layer maximum where a
    model varies it.
    """

    path: pathlib.Path
    size: int
    name: str
    architecture: str
    quantization: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    max_context: int
    chat_template: str | None

    @property
    def bytes_per_token(self) -> int:
        """KV-cache bytes one token costs in bf16, keys and values across all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


@functools.cache
def loadable_types() -> frozenset:
    """Tensor types transformers reads back: plain floats and integers, and every block format
    gguf-py can dequantize (its quantization traits table)."""
    import gguf  # the borrowed GPU machines lack it, and the CLI (bench gpu) runs there without it

    q = gguf.GGMLQuantizationType
    plain = {q.F32, q.F16, q.BF16, q.F64, q.I8, q.I16, q.I32, q.I64}
    return frozenset(plain | set(gguf.quants._type_traits))


def read_info(path: str | os.PathLike) -> GGUFInfo:
    """The header of the GGUF at ``path``; :class:`GGUFError` when it is not a GGUF, is cut
    short, or holds an architecture or tensor type transformers cannot load."""
    path = pathlib.Path(path)
    try:
        header = read_header(path)
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except (HeaderError, OSError) as exc:
        raise GGUFError(f"{path} is not a readable GGUF file (truncated or damaged?): {first_line(exc)}") from None
    size = path.stat().st_size
    needed = max((t.data_offset + _n_bytes(t) for t in header.tensors), default=0)
    if needed > size:
        raise GGUFError(f"{path} is truncated: it has {size:,} bytes, its tensors need {needed:,}")
    arch = header.fields.get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFError(f"{path} names no architecture (general.architecture)")
    if arch not in GGUF_SUPPORTED_ARCHITECTURES and arch.replace("-", "_") not in GGUF_SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"{path.name}: architecture {arch!r} cannot be loaded; "
            f"transformers reads GGUF {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}"
        )
    odd = sorted({_kind_name(t.kind) for t in header.tensors if t.kind not in loadable_types()})
    if odd:
        raise GGUFError(
            f"{path.name}: tensor type {', '.join(odd)} cannot be dequantized; "
            f"loadable: {', '.join(sorted(_kind_name(t) for t in loadable_types()))}"
        )
    return _info(header, path, size, arch)


def _kind_name(kind: int) -> str:
    """``Q4_K`` for a GGML tensor type number, ``type 99`` for one gguf-py does not know."""
    import gguf  # see loadable_types

    try:
        return gguf.GGMLQuantizationType(kind).name
    except ValueError:
        return f"type {kind}"


def _n_bytes(tensor: TensorEntry) -> int:
    """The bytes a tensor's data takes: its elements in blocks of its type (0 for an unknown type,
    which :func:`read_info` refuses by name)."""
    import gguf  # see loadable_types

    try:
        block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(tensor.kind)]
    except (ValueError, KeyError):
        return 0
    return math.prod(tensor.shape) * block_bytes // block


def _info(header: GGUFHeader, path: pathlib.Path, size: int, arch: str) -> GGUFInfo:
    """The :class:`GGUFInfo` of a checked header."""
    import gguf  # see loadable_types

    def number(key: str, default: int = 0) -> int:
        value = header.fields.get(f"{arch}.{key}")
        try:
            if isinstance(value, list):  # per-layer values (some hybrids): the cache's widest layer
                value = max(value, default=default)
            return int(value) if value is not None else default
        except (TypeError, ValueError):
            raise GGUFError(f"{path.name}: {arch}.{key} is {value!r}, not a whole number") from None

    q_heads = number("attention.head_count", 1)
    hidden = number("embedding_length")
    file_type = header.fields.get("general.file_type")
    if isinstance(file_type, int) and file_type in {t.value for t in gguf.LlamaFileType}:
        quantization = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    else:
        kinds = collections.Counter(_kind_name(t.kind) for t in header.tensors if len(t.shape) > 1)
        quantization = kinds.most_common(1)[0][0] if kinds else "unknown"
    template = header.fields.get("tokenizer.chat_template")
    return GGUFInfo(
        path=path,
        size=size,
        name=str(header.fields.get("general.name") or path.stem),
        architecture=arch,
        quantization=quantization,
        layers=number("block_count"),
        q_heads=q_heads,
        kv_heads=number("attention.head_count_kv", q_heads),
        head_dim=number("attention.key_length", hidden // max(q_heads, 1)),
        max_context=number("context_length"),
        chat_template=template if isinstance(template, str) else None,
    )


def file_digest(path: str | os.PathLike) -> str:
    """The first 16 hex digits of the file's SHA-256: the key its converted weights are cached under.

    A content-addressed file (Ollama's blobs are named ``sha256-<hex>``) is not read again."""
    match = _ADDRESSED.fullmatch(pathlib.Path(path).name)
    if match:
        return match.group(1)[:16]
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (or its type name)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


_READ_ONCE = threading.RLock()  # one thread at a time swaps the reader in (conversions are rare)


@contextlib.contextmanager
def parsed_once() -> Iterator[None]:
    """While it lasts, transformers parses each GGUF file once.

    For an architecture its newer reader does not cover (llama, qwen3, ...), transformers' GGUF
    loading builds a ``gguf.GGUFReader`` for the config, again for the weights and again for the
    tokenizer's config, and each build walks every entry of the vocabulary, string by string
    (SmolLM2's 49k; Qwen3's 151k).  Here the three share one reader, which nothing modifies (it
    maps the file read-only).  Measured in CPU seconds: converting the embedded GGUF 20.8 -> 15.0,
    a tiny model's GGUF with the same vocabulary 12.9 -> 6.9."""
    import gguf  # see loadable_types

    with _READ_ONCE:
        build, readers = gguf.GGUFReader, {}

        def shared(path, mode="r"):
            key = (os.fspath(path), mode)
            if key not in readers:
                readers[key] = build(path, mode)
            return readers[key]

        gguf.GGUFReader = shared  # transformers imports it from the package at each load
        try:
            yield
        finally:
            gguf.GGUFReader = build
