"""The GPU benchmark's logic, run on the CPU with a small random geometry (the command itself needs CUDA)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from thinkviz.bench.gpu import (
    ContextRow,
    gpu_report,
    markdown,
    measure_context,
    peak_bytes,
    write_report,
)
from tiny_models import SMALL
from thinkviz.models.random_weights import random_model


@pytest.fixture(scope="module")
def small():
    return random_model(SMALL, "cpu")


def test_full_and_h2o_at_a_context(small):
    full = measure_context(small, "full", 512, 0.25, decode_tokens=6)
    h2o = measure_context(small, "h2o", 512, 0.25, decode_tokens=6)
    per_token = small.geometry.bytes_per_token
    assert (full.budget, h2o.budget) == (None, 128)
    assert full.final_kv_bytes == (512 + 6) * per_token  # everything kept
    assert h2o.final_kv_bytes <= (128 + 1) * per_token  # evicted down to the budget at every step
    for row in (full, h2o):
        assert row.decode_tokens == 5  # the first step is not timed
        assert row.prefill_tokens_per_second > 0 and row.decode_tokens_per_second > 0
        assert row.peak_bytes is None  # no CUDA reading on a CPU


def test_small_contexts_keep_a_workable_budget(small):
    assert measure_context(small, "h2o", 128, 0.1, decode_tokens=2).budget == 64
    with pytest.raises(ValueError, match="decode_tokens must be at least 2"):
        measure_context(small, "h2o", 128, 0.1, decode_tokens=1)


def test_peak_is_read_only_on_cuda():
    assert peak_bytes(torch.device("cpu")) is None


def test_report_json_and_markdown(small, tmp_path):
    messages = []
    report = gpu_report(
        small,
        contexts=[128, 256],
        policies=["full", "h2o"],
        budget_fraction=0.25,
        decode_tokens=3,
        ratio_tokens=4,
        repeats=1,
        progress=messages.append,
    )
    assert [r["scoring"] for r in report["ratio"]] == [True, False]
    assert all(r["ratio"] == r["engine_tokens_per_second"] / r["generate_tokens_per_second"] for r in report["ratio"])
    assert [(r["context"], r["policy"]) for r in report["contexts"]] == [
        (128, "full"),
        (128, "h2o"),
        (256, "full"),
        (256, "h2o"),
    ]
    assert set(report["contexts"][0]) == set(ContextRow.__dataclass_fields__)
    assert report["meta"]["model"] == "small-qwen3 geometry, random weights"
    assert report["meta"]["kv_bytes_per_token"] == small.geometry.bytes_per_token
    assert messages[0] == "engine vs model.generate, scoring on" and messages[-1] == "h2o at 256 tokens of context"
    json_path, md_path = write_report(report, tmp_path / "out")
    assert json.loads(json_path.read_text()) == json.loads(json.dumps(report))
    table = md_path.read_text()
    assert table == markdown(report)
    assert "| 256 | h2o | 64 |" in table and "| 128 | full | – |" in table
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(rows) == (1 + 2) + (1 + 4)  # each table: a header, then scoring on/off and the four runs


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_the_command_refuses_without_cuda_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "thinkviz", "bench", "gpu"], check=False, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "thinkviz: error: bench gpu needs a CUDA GPU, and this machine has none (torch.cuda.is_available() is False)"
    )
