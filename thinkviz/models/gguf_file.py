"""What a GGUF file holds, read from its header alone: architecture, geometry, quantization.

GGUF (llama.cpp's single-file format) opens with key/value metadata
(``general.architecture``, ``<arch>.block_count``, ``<arch>.attention.head_count_kv``, the
tokenizer and its chat template) and a table of tensors, each with its type (``F16``,
``Q4_K``, ``Q8_0``...) and offset; the weights follow.  :func:`read_info` reads the header
with ``gguf``'s reader (memory-mapped: the weights are not read) and checks, before any
slow conversion, what transformers' GGUF support can load: its architecture, every tensor's
type, and that the file holds every byte its table promises (a download cut short fails
here, in one line).

The KV geometry comes from the same keys llama.cpp reads (grouped-query attention: the
cache holds ``head_count_kv`` heads, not ``head_count``), so a model can be priced before it
is loaded.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import os
import pathlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

if TYPE_CHECKING:
    import gguf
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
    import gguf  # see loadable_types

    path = pathlib.Path(path)
    try:
        reader = gguf.GGUFReader(path)
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except Exception as exc:  # a boundary: gguf raises anything on a damaged header
        raise GGUFError(f"{path} is not a readable GGUF file (truncated or damaged?): {first_line(exc)}") from None
    size = path.stat().st_size
    needed = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
    if needed > size:
        raise GGUFError(f"{path} is truncated: it has {size:,} bytes, its tensors need {needed:,}")
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise GGUFError(f"{path} names no architecture (general.architecture)")
    if arch not in GGUF_SUPPORTED_ARCHITECTURES and arch.replace("-", "_") not in GGUF_SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"{path.name}: architecture {arch!r} cannot be loaded; "
            f"transformers reads GGUF {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}"
        )
    odd = sorted({t.tensor_type.name for t in reader.tensors if t.tensor_type not in loadable_types()})
    if odd:
        raise GGUFError(
            f"{path.name}: tensor type {', '.join(odd)} cannot be dequantized; "
            f"loadable: {', '.join(sorted(gguf.GGMLQuantizationType(t).name for t in loadable_types()))}"
        )
    return _info(reader, path, size, arch)


def _info(reader: gguf.GGUFReader, path: pathlib.Path, size: int, arch: str) -> GGUFInfo:
    """The :class:`GGUFInfo` of a checked reader."""
    import gguf  # see loadable_types

    def number(key: str, default: int = 0) -> int:
        value = _field(reader, f"{arch}.{key}")
        if isinstance(value, list):  # per-layer values (some hybrids): the cache's widest layer
            value = max(value, default=default)
        return int(value) if value is not None else default

    q_heads = number("attention.head_count", 1)
    hidden = number("embedding_length")
    file_type = _field(reader, "general.file_type")
    if file_type is not None and int(file_type) in {t.value for t in gguf.LlamaFileType}:
        quantization = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    else:
        kinds = collections.Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) > 1)
        quantization = kinds.most_common(1)[0][0] if kinds else "unknown"
    return GGUFInfo(
        path=path,
        size=size,
        name=str(_field(reader, "general.name") or path.stem),
        architecture=arch,
        quantization=quantization,
        layers=number("block_count"),
        q_heads=q_heads,
        kv_heads=number("attention.head_count_kv", q_heads),
        head_dim=number("attention.key_length", hidden // max(q_heads, 1)),
        max_context=number("context_length"),
        chat_template=_field(reader, "tokenizer.chat_template"),
    )


def _field(reader: gguf.GGUFReader, key: str):
    """A metadata value (str, number or list), ``None`` when the file lacks ``key``."""
    field = reader.get_field(key)
    return None if field is None else field.contents()


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
