"""A GGUF file's header, read without its long arrays: the metadata and the tensor table.

``gguf.GGUFReader`` (gguf-py, llama.cpp's own reader) builds a numpy view of every element of every
metadata array; a tokenizer's vocabulary and merges are hundreds of thousands of strings, so opening
the embedded model's file took 3 s of CPU here (49k tokens and their merges), for a header whose
other fields are a few hundred bytes; this reader takes 0.03 s.  :func:`read_header` walks the same layout with
``struct`` and steps over the arrays it does not keep: the tokenizer's tables are read where the
model is converted (transformers, which uses gguf-py), not to list or check a file.

Layout (GGUF v2 and v3, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): ``GGUF``,
``u32`` version, ``u64`` tensor count, ``u64`` metadata count; each metadata entry a string key, a
``u32`` type and its value (an array: ``u32`` element type, ``u64`` count, the elements); each
tensor a string name, ``u32`` dimension count, ``u64`` dimensions, ``u32`` type, ``u64`` offset into
the data, which starts at the next multiple of ``general.alignment`` (32 unless set).  Strings are a
``u64`` length and UTF-8 bytes.  Numbers are little-endian, or big-endian in a file written so (its
version then reads byte-swapped).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

KEPT_ARRAY = 4096  # arrays up to this length are read (per-layer head counts, languages); longer ones skipped
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class HeaderError(ValueError):
    """The bytes are not a GGUF header this reader understands (cut short, damaged, another format)."""


@dataclass(frozen=True)
class TensorEntry:
    """One row of the tensor table: ``kind`` is the GGML type number (``gguf.GGMLQuantizationType``)."""

    name: str
    shape: tuple[int, ...]
    kind: int
    data_offset: int  # from the start of the file


@dataclass(frozen=True)
class GGUFHeader:
    """``fields``: metadata key → value (str, number, bool or list); an array longer than
    :data:`KEPT_ARRAY` (a vocabulary, its merges and scores) maps to ``None``: present, not read."""

    fields: dict[str, Any]
    tensors: tuple[TensorEntry, ...]


class _Cursor:
    """Reads the header's values in order from ``data`` (a memory map)."""

    def __init__(self, data: mmap.mmap, order: str) -> None:
        self.data, self.order, self.at = data, order, 0

    def number(self, code: str) -> Any:
        (value,) = struct.unpack_from(self.order + code, self.data, self.at)
        self.at += struct.calcsize(code)
        return value

    def string(self) -> str:
        length = self.number("Q")
        if self.at + length > len(self.data):
            raise HeaderError(f"a string of {length:,} bytes runs past the end of the file")
        text = self.data[self.at : self.at + length].decode("utf-8", errors="replace")
        self.at += length
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.number(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array()
        raise HeaderError(f"unknown metadata type {kind} at byte {self.at}")

    def array(self) -> list | None:
        kind, count = self.number("I"), self.number("Q")
        if count <= KEPT_ARRAY or kind == _ARRAY:  # short arrays, and arrays of arrays as gguf-py reads them
            return [self.value(kind) for _ in range(count)]
        if kind in _SCALARS:  # a long table of numbers (token types, scores): stepped over
            self.at += count * struct.calcsize(_SCALARS[kind])
        elif kind == _STRING:  # the vocabulary, the merges: each string's length, then stepped over
            for _ in range(count):
                length = self.number("Q")
                self.at += length
        else:
            raise HeaderError(f"unknown array element type {kind} at byte {self.at}")
        if self.at > len(self.data):
            raise HeaderError("an array runs past the end of the file")
        return None


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """The metadata and tensor table of the GGUF at ``path``; :class:`HeaderError` on anything else.
    ``FileNotFoundError`` (and other ``OSError``) as ``open`` raises them."""
    with open(path, "rb") as stream:
        try:
            data = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise HeaderError("the file is empty") from None
    with data:
        if data[:4] != b"GGUF":
            raise HeaderError("it does not start with GGUF")
        try:
            return _parse(data)
        except struct.error:
            raise HeaderError("the header is cut short") from None


def _parse(data: mmap.mmap) -> GGUFHeader:
    (version,) = struct.unpack_from("<I", data, 4)
    order = "<" if version & 0xFFFF else ">"  # a big-endian file's version reads byte-swapped
    cursor = _Cursor(data, order)
    cursor.at = 4
    version = cursor.number("I")
    if version not in (2, 3):
        raise HeaderError(f"GGUF version {version} (this reader knows 2 and 3)")
    tensor_count, field_count = cursor.number("Q"), cursor.number("Q")
    fields = {}
    for _ in range(field_count):
        key = cursor.string()
        fields[key] = cursor.value(cursor.number("I"))
    table = []
    for _ in range(tensor_count):
        name = cursor.string()
        shape = tuple(cursor.number("Q") for _ in range(cursor.number("I")))
        table.append((name, shape, cursor.number("I"), cursor.number("Q")))
    alignment = fields.get("general.alignment", 32)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1:
        raise HeaderError(f"general.alignment is {alignment!r}, not a positive whole number")
    start = -(-cursor.at // alignment) * alignment  # the next multiple, in whole numbers
    tensors = tuple(TensorEntry(name, shape, kind, start + offset) for name, shape, kind, offset in table)
    return GGUFHeader(fields, tensors)
