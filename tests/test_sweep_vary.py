"""Sweeps that vary any declared knob, not only the budget: ``bench sweep --vary recent=16,32,64``."""

from __future__ import annotations

import csv

import pytest

from thinkviz.measure.replay import Trace
from thinkviz.sweep.grid import Budget, parse_vary, sweep_trace, write_rows
from thinkviz.viz.pareto import pareto_figure

from cli_run import run_cli

TRACE = Trace(
    name="tiny",
    system="You are a careful assistant.",
    question="What does 2 + 3 * 4 evaluate to?",
    text=(
        "<think>\nMultiplication binds tighter, so 3 * 4 = 12 first.\n\nThen 2 + 12 = 14.\n</think>\n\n"
        "The answer is 14.\n"
    )
    * 3,
)


def test_a_varied_knob_gives_one_row_per_value_and_policies_without_it_run_once(tiny_llama, tmp_path):
    vary = parse_vary("recent=2,4,8")
    rows, replay = sweep_trace(tiny_llama, TRACE, ["h2o", "window"], [Budget(24, False)], 8, {}, vary=vary)
    assert [(r["policy"], r["knobs"]) for r in rows] == [
        ("full", ""),
        ("h2o", "recent=2"),
        ("h2o", "recent=4"),
        ("h2o", "recent=8"),
        ("window", ""),
    ]
    assert [run.policy.config["recent"] for run in replay.runs[:3]] == [2, 4, 8]
    assert len({r["kl"] for r in rows[1:4]}) > 1  # the knob changed what the cache kept
    paths = write_rows(rows, tmp_path, {"vary": vary})
    with open(paths["csv"], newline="", encoding="utf-8") as fh:
        assert [row["knobs"] for row in csv.DictReader(fh)] == ["", "recent=2", "recent=4", "recent=8", ""]
    assert "h2o · recent=4" in paths["md"].read_text(encoding="utf-8")
    legend = {trace.name for trace in pareto_figure(rows).data if trace.showlegend is not False}
    assert {"h2o · recent=2", "h2o · recent=8", "window"} <= legend


def test_varying_the_budget_itself_and_two_knobs_at_once(tiny_llama):
    vary = parse_vary("budget=24,48; recent=2,4")
    rows, _ = sweep_trace(tiny_llama, TRACE, ["h2o"], [Budget(0.5, True)], 8, {}, vary=vary)
    assert [(r["budget"], r["knobs"]) for r in rows[1:]] == [
        ("24", "budget=24, recent=2"),
        ("24", "budget=24, recent=4"),
        ("48", "budget=48, recent=2"),
        ("48", "budget=48, recent=4"),
    ]
    assert [r["budget_tokens"] for r in rows[1:]] == [24, 24, 48, 48]


@pytest.mark.parametrize(
    "text, reason", [("recent", "KNOB=V1,V2"), ("recent=", "KNOB=V1,V2"), ("recent=2;recent=4", "varied twice")]
)
def test_bad_vary_text_is_refused(text, reason):
    with pytest.raises(ValueError, match=reason):
        parse_vary(text)


@pytest.mark.parametrize(
    "args, reason",
    [
        (["--vary", "recent"], "vary a knob as KNOB=V1,V2"),
        (["--vary", "n_sink=1,2", "--policies", "h2o"], "no selected policy takes parameter n_sink"),
        (["--vary", "recent=16,lots", "--policies", "h2o"], "recent must be an integer, got 'lots'"),
        (["--vary", "recent=16,32", "--param", "recent=8", "--policies", "h2o"], "--vary and --param both set"),
    ],
)
def test_bad_vary_arguments_exit_with_one_line_before_loading(args, reason):
    result = run_cli("bench", "sweep", "--trace", "math_h2o_vs_window", *args, before_loading=True)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("thinkviz: error:") and reason in lines[0], result.stderr


def test_the_sweep_tab_varies_a_knob_as_the_cli_does(tiny_llama):
    from thinkviz.ui.sweep_run import sweep_frames

    frames = list(
        sweep_frames(
            tiny_llama, TRACE, ["h2o", "window"], [Budget(24, False)], 8, {}, poll=0.0, vary=parse_vary("recent=2,8")
        )
    )
    assert "the full cache + 2 policies in 3 variants × 1 budgets" in frames[0].status
    final = frames[-1]
    assert [row[0] for row in final.table] == ["full", "h2o · recent=2", "h2o · recent=8", "window"]


def test_a_varied_knob_runs_for_each_policy_spec_with_its_own_knobs(tiny_llama):
    from thinkviz.sweep.grid import check_vary, vary_grid

    vary = parse_vary("budget=24,48")
    check_vary(["h2o:recent=2", "h2o:recent=8"], vary)
    assert vary_grid("h2o:recent=2", vary) == [{"budget": "24"}, {"budget": "48"}]
    rows, replay = sweep_trace(
        tiny_llama, TRACE, ["h2o:recent=2", "h2o:recent=8"], [Budget(0.5, True)], 8, {}, vary=vary
    )
    assert [(r["policy"], r["knobs"]) for r in rows[1:]] == [
        ("h2o:recent=2", "budget=24"),
        ("h2o:recent=2", "budget=48"),
        ("h2o:recent=8", "budget=24"),
        ("h2o:recent=8", "budget=48"),
    ]
    assert [(run.policy.config["recent"], run.policy.config["budget"]) for run in replay.runs] == [
        (2, 24),
        (2, 48),
        (8, 24),
        (8, 48),
    ]
    with pytest.raises(ValueError, match="'h2o:recent=2' sets recent, which --vary also varies"):
        check_vary(["h2o:recent=2"], parse_vary("recent=4,8"))
