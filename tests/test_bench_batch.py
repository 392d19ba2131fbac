"""``bench batch`` checks its arguments and reports its two ratios last, on a tiny model in-process."""

from __future__ import annotations

import re

import pytest

from thinkviz.bench.batch import measure_batch
from thinkviz.cli import main
from thinkviz.measure.replay import load_trace, prepare
from tiny_models import save_tiny_model

SMALL = ["--trace-tokens", "48", "--new-tokens", "6", "--budget", "48", "--interval", "8"]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-batch"))


@pytest.mark.parametrize(
    "args, reason",
    [
        (["--columns", "h2o,nosuch"], "--columns: unknown policy 'nosuch'"),
        (["--sweep-policies", ""], "--sweep-policies: no policies given"),
        (["--new-tokens", "0"], "must be at least 1"),
        (["--budget", "16"], "budget (16) must be larger than"),
    ],
)
def test_bad_arguments_exit_with_one_line(tiny_folder, capsys, args, reason):
    assert main(["bench", "batch", "--model", tiny_folder, "--device", "cpu", *SMALL, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and reason in err[0]


def test_the_report_ends_with_the_two_ratios(tiny_folder, capsys):
    argv = ["bench", "batch", "--model", tiny_folder, "--quant", "none", "--device", "cpu", *SMALL]
    assert main([*argv, "--columns", "full,h2o,window", "--sweep-policies", "h2o,window"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    compare = re.fullmatch(
        r"compare, 3 columns batched ÷ 1 column: ([\d.]+)  \(peak memory \d+ MiB; target <= 2\)", lines[-2]
    )
    sweep = re.fullmatch(
        r"sweep group, 2 policies batched ÷ 1 replay: ([\d.]+)  \(peak memory \d+ MiB; target <= 4\)", lines[-1]
    )
    assert compare and sweep and float(compare[1]) > 0 and float(sweep[1]) > 0
    assert sum("tok/s per column" in line for line in lines) == 9


def test_every_contender_advances_every_run_as_far(tiny_llama):
    """The batched and unbatched contenders do the same work as each other: the same tokens per run."""
    prompt, ids = prepare(tiny_llama, load_trace("math_h2o_vs_window"), 40)
    result = measure_batch(tiny_llama, prompt, ids, ("full", "h2o"), ("h2o", "window"), 5, 48, 8)
    for name, timings in result.scenarios.items():
        tokens = {key: timing.tokens for key, timing in timings.items()}
        assert len(set(tokens.values())) == 1 and tokens["one"] == (5 if name == "compare generate" else 40)
        assert timings["batched"].runs == timings["unbatched"].runs == (2 if name != "sweep group" else 3)
