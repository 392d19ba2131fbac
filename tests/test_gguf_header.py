"""The GGUF header reader against gguf-py's own reader, on files gguf-py writes: every kept field and
every tensor row the same; long arrays present but not read; damage refused in one line."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from thinkviz.models.gguf_file import GGUFError, read_info
from thinkviz.models.gguf_header import KEPT_ARRAY, HeaderError, read_header

V = gguf.GGUFValueType


def _write(path, endian=gguf.GGUFEndian.LITTLE, alignment=None):
    writer = gguf.GGUFWriter(path, "llama", endianess=endian)
    writer.add_name("tiny")
    writer.add_block_count(2)
    writer.add_head_count(4)
    writer.add_key_value("llama.attention.head_count_kv", [1, 2], V.ARRAY, V.UINT32)  # per layer
    writer.add_key_value("test.flag", True, V.BOOL)
    writer.add_key_value("test.signed", -7, V.INT64)
    writer.add_key_value("test.ratio", 0.5, V.FLOAT64)
    writer.add_key_value("test.nested", [[1, 2], [3]], V.ARRAY, V.ARRAY)
    writer.add_key_value("tokenizer.ggml.tokens", [f"tok{i}" for i in range(5000)], V.ARRAY, V.STRING)
    writer.add_key_value("tokenizer.ggml.scores", [0.25] * (KEPT_ARRAY + 1), V.ARRAY, V.FLOAT32)
    writer.add_chat_template("{{ messages }} ü")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_tensor("token_embd.weight", np.ones((6, 32), dtype=np.float32))
    writer.add_tensor(
        "blk.0.attn_q.weight",
        gguf.quants.quantize(np.ones((4, 32), np.float32), gguf.GGMLQuantizationType.Q8_0),
        raw_dtype=gguf.GGMLQuantizationType.Q8_0,
    )
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float16))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    return path


@pytest.mark.parametrize(
    "endian, alignment", [(gguf.GGUFEndian.LITTLE, None), (gguf.GGUFEndian.BIG, None), (gguf.GGUFEndian.LITTLE, 64)]
)
def test_the_header_matches_gguf_py(tmp_path, endian, alignment):
    path = _write(tmp_path / "t.gguf", endian, alignment)
    header, reference = read_header(path), gguf.GGUFReader(path)
    fields = {key: field for key, field in reference.fields.items() if not key.startswith("GGUF.")}  # its own
    assert set(header.fields) == set(fields)
    for key, field in fields.items():
        skipped = key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores")
        want = None if skipped else field.contents()
        if key == "test.nested":  # gguf-py's contents() flattens an array of arrays; the header keeps it
            want = [[1, 2], [3]]
        assert header.fields[key] == pytest.approx(want) if isinstance(want, float) else header.fields[key] == want
    assert [(t.name, t.shape, t.kind, t.data_offset) for t in header.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset)) for t in reference.tensors
    ]
    info = read_info(path)
    assert (info.kv_heads, info.q_heads, info.chat_template) == (2, 4, "{{ messages }} ü")


@pytest.mark.parametrize(
    "cut, reason",
    [
        (lambda data: b"", "the file is empty"),
        (lambda data: b"GGML" + data[4:], "does not start with GGUF"),
        (lambda data: data[:200], "cut short|past the end"),
        (lambda data: data[:4] + (1).to_bytes(4, "little") + data[8:], "GGUF version 1"),
    ],
)
def test_damaged_headers_are_refused_in_one_line(tmp_path, cut, reason):
    data = _write(tmp_path / "t.gguf").read_bytes()
    (tmp_path / "bad.gguf").write_bytes(cut(data))
    with pytest.raises(HeaderError, match=reason):
        read_header(tmp_path / "bad.gguf")
    with pytest.raises(GGUFError, match="is not a readable GGUF file") as caught:
        read_info(tmp_path / "bad.gguf")
    assert "\n" not in str(caught.value)


def test_a_file_whose_data_is_cut_short_is_truncated(tmp_path):
    data = _write(tmp_path / "t.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-10])
    with pytest.raises(GGUFError, match=r"is truncated: it has [\d,]+ bytes, its tensors need [\d,]+"):
        read_info(tmp_path / "cut.gguf")


def test_a_count_written_as_text_is_refused_in_one_line(tmp_path):
    writer = gguf.GGUFWriter(tmp_path / "odd.gguf", "llama")
    writer.add_key_value("llama.block_count", "thirty", V.STRING)
    writer.add_key_value("general.file_type", "Q4_K", V.STRING)
    writer.add_tensor("token_embd.weight", np.ones((6, 32), dtype=np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    with pytest.raises(GGUFError, match="llama.block_count is 'thirty', not a whole number") as caught:
        read_info(tmp_path / "odd.gguf")
    assert "\n" not in str(caught.value)
