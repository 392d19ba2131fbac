"""`bench summary`: sweeps lined up per (policy, budget) with a column per trace, and its errors."""

from __future__ import annotations

import dataclasses
import json

import pytest

from thinkviz.bench.summary import SummaryError, load_sweep_rows, select_runs, summary_table
from thinkviz.sweep.grid import Budget, sweep_trace, write_rows
from thinkviz.cli import main
from thinkviz.measure.replay import Trace

TRACE = Trace(
    name="tiny",
    system="You are a careful assistant.",
    question="Is 91 prime?",
    text="<think>\n91 = 7 * 13, so it has divisors besides 1 and itself.\n</think>\n\nNo: 91 = 7 × 13.\n",
)


def _row(trace, policy, budget, kv, nll_delta, kl=0.1, top1=0.9):
    return {
        "trace": trace,
        "policy": policy,
        "budget": budget,
        "kv_fraction": kv,
        "nll_delta": nll_delta,
        "kl": kl,
        "top1": top1,
    }


ROWS = [
    _row("math", "full", "100%", 1.0, 0.0, 0.0, 1.0),
    _row("math", "window", "25%", 0.264, 0.140, top1=0.877),
    _row("math", "streaming", "25%", 0.264, 0.140, top1=0.877),
    _row("math", "h2o", "25%", 0.264, 0.150, top1=0.894),
    _row("math", "think_drop", "25%", 1.0, 0.0, top1=1.0),  # over budget: best value, never bold
    _row("code", "full", "100%", 1.0, 0.0, 0.0, 1.0),
    _row("code", "window", "25%", 0.262, 0.528, top1=0.70),
    _row("code", "h2o", "25%", 0.262, 0.278, top1=0.80),
    _row("code", "think_drop", "25%", 0.717, 0.096, top1=0.95),
]


def _lines(table: str) -> dict[str, str]:
    return {" | ".join(line.split(" | ")[:2]).lstrip("| "): line for line in table.splitlines()[2:]}


def test_one_row_per_policy_and_budget_one_column_per_trace():
    table = summary_table(ROWS)
    assert table.splitlines()[0] == "| policy | budget | math | code | mean | peak KV (of full, worst) |"
    lines = _lines(table)
    assert list(lines) == ["full | 100%", "window | 25%", "streaming | 25%", "h2o | 25%", "think_drop | 25%"]
    assert lines["window | 25%"] == "| window | 25% | **0.140** | 0.528 | 0.334 | 26.4% |"
    # a trace without the row shows a dash and is left out of the mean
    assert lines["streaming | 25%"] == "| streaming | 25% | **0.140** | – | 0.140 | 26.4% |"
    assert lines["h2o | 25%"] == "| h2o | 25% | 0.150 | **0.278** | 0.214 | 26.4% |"
    # think_drop's lower loss comes from memory it was not given: reported, not bold
    assert lines["think_drop | 25%"] == "| think_drop | 25% | 0.000 | 0.096 | 0.048 | 100.0% |"
    assert "**" not in lines["full | 100%"]


def test_top1_is_better_when_higher():
    lines = _lines(summary_table(ROWS, "top1"))
    assert lines["h2o | 25%"] == "| h2o | 25% | **89.4%** | **80.0%** | 84.7% | 26.4% |"
    assert "**" not in lines["window | 25%"]
    with pytest.raises(SummaryError, match="unknown metric 'ppl'"):
        summary_table(ROWS, "ppl")


@pytest.fixture
def two_sweeps(tiny_llama, tmp_path_factory):
    """Two traces swept separately on the tiny model, each written by ``write_rows``."""
    folders = []
    for name in ("first", "second"):
        rows, _ = sweep_trace(
            tiny_llama,
            dataclasses.replace(TRACE, name=name),
            ["window", "h2o"],
            [Budget(0.5, True)],
            interval=8,
            params={"recent": 4},
        )
        folder = tmp_path_factory.mktemp(name)
        write_rows(rows, folder, {"model": tiny_llama.name})
        folders.append(folder)
    return folders


def test_cli_lines_up_sweep_folders_and_writes_the_table_and_figure(two_sweeps, tmp_path, capsys):
    first, second = two_sweeps
    out = tmp_path / "summary"
    assert main(["bench", "summary", str(first), str(second / "sweep.json"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = (out / "summary.md").read_text(encoding="utf-8")
    assert printed.startswith(table)
    assert table.splitlines()[0].startswith("| policy | budget | first | second | mean |")
    rows = json.loads((first / "sweep.json").read_text(encoding="utf-8"))["rows"]
    window = next(row for row in rows if row["policy"] == "window")
    assert f"| window | 50% | {window['nll_delta']:.3f}" in table.replace("**", "")
    assert "Plotly.newPlot" in (out / "pareto.html").read_text(encoding="utf-8")
    assert len(load_sweep_rows([first, second])) == 2 * len(rows)


def test_policies_keeps_the_rows_of_the_runs_named_and_refuses_a_name_no_row_has(tmp_path, capsys):
    kept = select_runs(ROWS, ["full", "h2o"])
    assert [(row["trace"], row["policy"]) for row in kept] == [
        ("math", "full"),
        ("math", "h2o"),
        ("code", "full"),
        ("code", "h2o"),
    ]
    assert [line.split(" | ")[0] for line in summary_table(kept).splitlines()[2:]] == ["| full", "| h2o"]
    with pytest.raises(SummaryError, match="no rows of 'knorm' in the sweeps given"):
        select_runs(ROWS, ["h2o", "knorm"])
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"meta": {}, "rows": ROWS}), encoding="utf-8")
    assert main(["bench", "summary", str(path), "--policies", "window, think_drop"]) == 0
    printed = capsys.readouterr().out
    assert "| window | 25% |" in printed and "| think_drop | 25% |" in printed and "| h2o |" not in printed
    assert main(["bench", "summary", str(path), "--policies", "knorm"]) == 2
    assert "no rows of 'knorm'" in capsys.readouterr().err


def test_the_same_sweep_twice_is_refused(two_sweeps):
    with pytest.raises(SummaryError, match="first / window / 50% is also in"):
        load_sweep_rows([two_sweeps[0], two_sweeps[0] / "sweep.json"])


def test_sweeps_of_one_trace_with_other_policies_share_its_reference(tmp_path):
    def sweep(name, rows):
        (tmp_path / name).write_text(json.dumps({"meta": {}, "rows": rows}), encoding="utf-8")
        return tmp_path / name

    def row(policy, budget, tokens=300, nll=0.0):
        return {
            "trace": "t",
            "policy": policy,
            "budget": budget,
            "kv_fraction": 0.3,
            "kl": nll,
            "nll_delta": nll,
            "top1": 1.0,
            "trace_tokens": tokens,
        }

    first = sweep("a.json", [row("full", "100%"), row("h2o", "25%", nll=0.2)])
    second = sweep("b.json", [row("full", "100%"), row("window", "25%", nll=0.3)])
    rows = load_sweep_rows([first, second])
    assert [r["policy"] for r in rows] == ["full", "h2o", "window"]
    assert [line.split(" | ")[0] for line in summary_table(rows).splitlines()[2:]] == ["| full", "| h2o", "| window"]
    longer = sweep("c.json", [row("full", "100%", tokens=600), row("window", "50%")])
    with pytest.raises(SummaryError, match="c.json: t / full / 100% is also in"):
        load_sweep_rows([first, longer])


@pytest.mark.parametrize(
    "content, reason",
    [
        (None, "does not exist"),
        (b"\x00\x01binary", "is not a sweep result"),
        (b"{not json", "is not a sweep result"),
        (b'{"meta": {}}', "no 'rows' list"),
        (b'{"rows": [{"trace": "t", "policy": "h2o"}]}', "row 1 lacks budget, kv_fraction"),
    ],
)
def test_bad_sweep_files_exit_non_zero_with_one_line(tmp_path, capsys, content, reason):
    path = tmp_path / "sweep.json"
    if content is not None:
        path.write_bytes(content)
    assert main(["bench", "summary", str(path)]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("thinkviz: error:") and reason in lines[0], captured.err
    assert captured.out == ""


def test_kv_formats_are_rows_of_their_own_with_a_kv_column():
    rows = [dict(row) for row in ROWS if row["trace"] == "math"] + [
        {**_row("math", "full", "100%", 0.28, 0.02), "kv_quant": "q8_0"},
        {**_row("math", "window", "25%", 0.074, 0.30), "kv_quant": "q4_0"},
        {**_row("math", "h2o", "25%", 0.074, 0.20), "kv_quant": "q4_0"},
    ]
    table = summary_table(rows)
    assert table.splitlines()[0] == "| policy | budget | KV | math | mean | peak KV (of full, worst) |"
    body = table.splitlines()[2:]
    assert "| full | 100% | q8_0 | 0.020 | 0.020 | 28.0% |" in body  # the pure quantization baseline, never bold
    assert "| window | 25% | none | **0.140** | 0.140 | 26.4% |" in body  # best of the full-precision rows
    assert "| h2o | 25% | q4_0 | **0.200** | 0.200 | 7.4% |" in body  # best of the q4_0 rows
    assert "| window | 25% | q4_0 | 0.300 | 0.300 | 7.4% |" in body
