"""The speed benchmarks run to completion on a tiny model (their numbers live in the docs)."""

from __future__ import annotations

import pytest

from thinkviz.cli import main
from tiny_models import save_tiny_model

pytestmark = pytest.mark.slow  # each test times a benchmark


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny random Llama saved as a model folder, so the CLI can load it by path."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def _bench(capsys, *args: str) -> str:
    """Run ``python -m thinkviz bench ARGS`` in-process; its stdout (the run must succeed)."""
    code = main(["bench", *args])
    out = capsys.readouterr().out
    assert code == 0
    return out


def _table_rows(out: str) -> dict[str, list[str]]:
    rows = [line.strip("|").split("|") for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}


def test_quant_speed_compares_every_backend_with_float(tiny_folder, capsys):
    out = _bench(
        capsys,
        "quant-speed",
        "--model",
        tiny_folder,
        "--device",
        "cpu",
        "--trace-tokens",
        "40",
        "--new-tokens",
        "4",
        "--chunk",
        "8",
        "--repeats",
        "1",
    )
    rows = _table_rows(out)
    assert list(rows) == ["float", "bitsandbytes", "torch-int4"]
    assert [rows[label][0] for label in rows] == ["none", "bitsandbytes", "torch-int4"]
    assert rows["float"][3] == "1.00" and rows["float"][7] == "0.0000"  # the reference against itself
    for label in ("bitsandbytes", "torch-int4"):
        decode, chunked, nll, kl = (float(rows[label][i]) for i in (2, 4, 6, 7))
        assert decode > 0 and chunked > 0 and nll > 0 and kl >= 0
    assert "torch-int4 ÷ bitsandbytes" in out and "auto picks" in out


def test_quant_speed_refuses_bad_numbers_in_one_line(capsys):
    assert main(["bench", "quant-speed", "--repeats", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at least 1" in err[0]


def test_profile_accounts_for_the_whole_decode_step(tiny_folder, capsys):
    out = _bench(
        capsys,
        "profile",
        "--model",
        tiny_folder,
        "--quant",
        "none",
        "--device",
        "cpu",
        "--budget",
        "40",
        "--new-tokens",
        "24",
        "--ops",
        "5",
    )
    parts = _table_rows(out.split("\n\n")[0])
    from thinkviz.bench import profile

    for part in (
        profile.LINEARS,
        profile.HEAD,
        profile.ATTENTION,
        profile.HOOKS,
        profile.POLICY,
        profile.GATHER,
        profile.REST,
    ):
        assert part in parts, part
    assert float(parts[profile.LINEARS][2]) == 2 * 7  # two layers, seven linears each, every step
    assert float(parts[profile.HEAD][2]) == 1
    assert float(parts[profile.POLICY][2]) > 0  # the 40-slot budget is exceeded: h2o selects
    shares = sum(float(cells[1].rstrip(" %")) for cells in parts.values())
    assert abs(shares - 100) < 1  # the parts add up to the step
    operators = _table_rows(out.split("\n\n")[1])
    assert len(operators) == 5 and all(name.startswith("aten::") for name in operators)


def test_profile_without_scores_of_an_attention_free_policy_runs_sdpa_without_hooks(tiny_folder, capsys):
    out = _bench(
        capsys,
        "profile",
        "--model",
        tiny_folder,
        "--quant",
        "none",
        "--device",
        "cpu",
        "--policy",
        "knorm",
        "--no-scoring",
        "--budget",
        "40",
        "--new-tokens",
        "24",
        "--ops",
        "3",
    )
    assert "scoring off, sdpa attention" in out.splitlines()[0]
    parts = _table_rows(out.split("\n\n")[0])
    from thinkviz.bench import profile

    assert profile.HOOKS not in parts and profile.ABSORB not in parts  # nothing captured
    assert float(parts[profile.POLICY][2]) > 0 and float(parts[profile.GATHER][2]) > 0  # knorm evicts
    assert float(parts[profile.SCORES][2]) == float(parts[profile.POLICY][2])  # scores only inside select


def test_overhead_at_long_context_gives_one_ratio_per_length(tiny_folder, capsys):
    out = _bench(
        capsys,
        "overhead",
        "--model",
        tiny_folder,
        "--quant",
        "none",
        "--device",
        "cpu",
        "--context",
        "64,300",
        "--new-tokens",
        "6",
        "--budget",
        "40",
    )
    rows = _table_rows(out)
    assert list(rows) == ["64", "300"]
    for cells in rows.values():
        engine, baseline, ratio = (float(c) for c in cells[2:5])
        assert engine > 0 and baseline > 0 and abs(ratio - engine / baseline) < 0.01


@pytest.mark.parametrize(
    "args, reason",
    [
        (["--context", "2048,abc"], "comma-separated"),
        (["--context", "8"], "at least 16"),
        (["--context", "4000", "--new-tokens", "1"], "--new-tokens must be"),
    ],
)
def test_overhead_context_refuses_bad_lengths_in_one_line(args, reason, capsys):
    assert main(["bench", "overhead", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and reason in err[0]


def test_overhead_context_longer_than_the_model_is_refused(tiny_folder, capsys):
    assert main(["bench", "overhead", "--model", tiny_folder, "--quant", "none", "--context", "2040"]) == 2
    assert "exceeds the model's context (2048)" in capsys.readouterr().err


def test_quant_kernels_times_every_shape_of_the_model(tiny_folder, capsys):
    out = _bench(capsys, "quant-kernels", "--model", tiny_folder, "--rows", "1,4", "--repeats", "1")
    lines = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    shapes = [line.split("|")[1].strip() for line in lines]
    # q/o, k/v, gate/up, down, then the head; one row per shape and row count
    assert shapes == [s for s in ("64 × 64", "32 × 64", "128 × 64", "64 × 128", "49152 × 64") for _ in (1, 4)]
    head = lines[-1].split("|")[3:7]
    assert head[1].strip() == "–" and head[3].strip() == "–"  # no NF4 head, no float32-input int4 head
    assert all(float(cell) > 0 for line in lines[:-2] for cell in line.split("|")[3:7])
