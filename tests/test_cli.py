"""The command line: one-line errors and a non-zero exit for bad arguments."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from thinkviz.cli import main
from thinkviz.core.events import RunRecord
from thinkviz.core.kvquant import KVQuant
from thinkviz.policies import policy_names

from cli_run import run_cli


def _cli(*args):
    """``python -m thinkviz ARGS`` in a new process, end to end."""
    return subprocess.run([sys.executable, "-m", "thinkviz", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args, reason",
    [
        (["generate", "--policy", "lru", "hello"], "unknown policy 'lru'"),
        (["generate", "--budget", "0", "hello"], "budget must be between"),
        (["generate", "--budget", "-5", "hello"], "budget must be between"),
        (["generate", "   "], "the prompt is empty"),
        (["generate", "--param", "recent=5000", "--budget", "64", "hi"], "recent must be between"),
        (["generate", "--max-new-tokens", "0", "hi"], "max_new_tokens"),
        (["generate", "--vram-cap", "-1", "hi"], "the VRAM cap must be a positive number of GiB, got -1.0"),
        (
            ["generate", "--vram-cap", "4", "--device", "cpu", "hi"],
            "a VRAM cap applies to a CUDA device, not cpu" if torch.cuda.is_available() else "needs a CUDA GPU",
        ),
        (["generate", "--model", "random:GPT-9", "--quant", "none", "hi"], "Unknown random-weights model"),
        (["generate", "--budget-fraction", "2", "hi"], "budget_fraction must be between 0.01 and 1.0, got 2.0"),
        (["bench", "overhead", "--policy", "lru"], "unknown policy 'lru'"),
        (["bench", "overhead", "--policy", "knorm", "--budget", "16"], "budget (16) must be larger"),
        (["generate", "--kv-quant", "q3_k", "hi"], "unknown KV format 'q3_k'; choose one of: none, q8_0"),
        (["generate", "--kv-quant", "kivi2", "--kv-residual", "1000", "hi"], "residual must be between 8 and 512"),
        (["bench", "overhead", "--kv-quant", "fp8"], "unknown KV format 'fp8'"),
    ],
)
def test_bad_arguments_exit_non_zero_with_one_line(args, reason):
    result = run_cli(*args)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and reason in lines[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_unknown_model_is_a_clear_error(tmp_path):
    result = _cli("generate", "--model", str(tmp_path / "nowhere"), "hi")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "thinkviz: error:" in result.stderr.splitlines()[-1]


@pytest.mark.integration
def test_generate_streams_and_writes_a_recording(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "generate",
            "--policy",
            "h2o",
            "--budget",
            "64",
            "--param",
            "recent=16",
            "--max-new-tokens",
            "12",
            "--json",
            str(out),
            "What is 2 + 3?",
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    assert "<think>" in captured.out
    assert "tok/s" in captured.err and "peak KV" in captured.err
    assert (tmp_path / "run.json").is_file() and (tmp_path / "run.npz").is_file()
    events = RunRecord.load(out).events
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    assert events and all(e.info["device_memory"]["kind"] == kind for e in events)  # measured every step


@pytest.mark.integration
def test_generate_with_a_quantized_kv_cache_records_its_format_and_bytes(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "generate",
            "--policy",
            "full",
            "--kv-quant",
            "kivi2",
            "--kv-residual",
            "16",
            "--max-new-tokens",
            "8",
            "--json",
            str(out),
            "What is 2 + 3?",
        ]
    )
    assert code == 0
    assert "KV format kivi2/r16" in capsys.readouterr().err
    record = RunRecord.load(out)
    assert record.meta["kv_quant"] == {"format": "kivi2", "bits": 2, "residual": 16}
    last, g = record.events[-1], record.meta["geometry"]  # every token kept: key groups of 32 beyond a window of 16
    stored = g["layers"] * KVQuant("kivi2", 16).layer_bytes(
        last.kv_tokens, g["kv_heads"], g["head_dim"], g["dtype_bytes"]
    )
    assert last.kv_bytes == stored < last.full_kv_bytes / 2


def test_the_readme_policy_table_is_the_registry_listing(capsys):
    """The README's table is ``python -m thinkviz policies --markdown``: a new policy appears in it by itself
    (after rerunning that command), and a stale table fails here."""
    assert main(["policies", "--markdown"]) == 0
    table = capsys.readouterr().out
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert table in readme, "README's policy table is stale: paste `python -m thinkviz policies --markdown`"


def test_policies_refuses_an_unknown_name_in_one_line():
    result = run_cli("policies", "lru", before_loading=True)
    assert result.returncode == 2
    assert result.stderr.strip() == f"thinkviz: error: unknown policy 'lru'; choose from: {', '.join(policy_names())}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_vram_cap_is_refused_on_a_cpu():
    result = run_cli("generate", "--vram-cap", "8", "hi", before_loading=True)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "thinkviz: error: a VRAM cap needs a CUDA GPU, and this machine has none (it runs on the CPU)"
    )


def test_the_console_script_is_the_module_entry_point():
    """``pip install -e .`` installs ``thinkviz`` = ``python -m thinkviz`` (pyproject's [project.scripts])."""
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    module, _, function = project["scripts"]["thinkviz"].partition(":")
    assert getattr(importlib.import_module(module), function) is main
    assert "dependencies" in project["dynamic"]
