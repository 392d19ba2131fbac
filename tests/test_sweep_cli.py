"""The sweep: budget parsing, rows on a tiny model, CSV/JSON/HTML output, CLI errors, Pareto front."""

from __future__ import annotations

import csv
import json
import math

import pytest

from thinkviz.core.kvquant import KVQuant
from thinkviz.sweep.grid import (
    COLUMNS,
    RESULT_COLUMNS,
    Budget,
    markdown_table,
    parse_budgets,
    parse_kv_quants,
    parse_policies,
    sweep_trace,
    write_rows,
)
from thinkviz.policies import policy_names
from thinkviz.measure.replay import Trace
from thinkviz.viz.pareto import pareto_figure, pareto_front

from cli_run import run_cli

TRACE = Trace(
    name="tiny",
    system="You are a careful assistant.",
    question="What does 2 + 3 * 4 evaluate to?",
    text=(
        "<think>\nMultiplication binds tighter, so 3 * 4 = 12 first.\n\nThen 2 + 12 = 14.\n</think>\n\n"
        "<think>\nCheck: (2 + 3) * 4 would be 20, which is not what the expression says.\n</think>\n\n"
        "The answer is 14.\n\n```python\nassert 2 + 3 * 4 == 14\n```\n"
    ),
)


def test_budgets_are_fractions_or_token_counts():
    budgets = parse_budgets("0.1, 0.25,1.0,128")
    assert [(b.fraction, b.label) for b in budgets] == [(True, "10%"), (True, "25%"), (True, "100%"), (False, "128")]
    assert budgets[1].tokens(1000) == 250 and budgets[3].tokens(1000) == 128
    for bad, reason in [("0", "positive integer"), ("1.5", r"\(0, 1\]"), ("abc", "neither"), ("0.0", r"\(0, 1\]")]:
        with pytest.raises(ValueError, match=reason):
            parse_budgets(bad)


def test_policies_all_excludes_the_reference_and_unknown_names_fail():
    assert parse_policies("all") == [n for n in policy_names() if n != "full"]
    assert parse_policies("h2o, window,h2o") == ["h2o", "window"]
    with pytest.raises(ValueError, match="unknown policy 'lru'"):
        parse_policies("h2o,lru")


def test_running_budgets_are_fractions_of_the_tokens_seen():
    budgets = parse_budgets("0.1,0.25", running=True)
    assert [(b.label, b.tokens(1001)) for b in budgets] == [("10% of seen", 101), ("25% of seen", 251)]
    assert budgets[1].policy_values(1001) == {"budget_mode": "fraction", "budget_fraction": 0.25}
    with pytest.raises(ValueError, match="tokens seen so far is a fraction"):
        parse_budgets("0.25,128", running=True)


def test_a_running_budget_sweep_keeps_that_share_of_the_tokens_seen(tiny_llama):
    rows, replay = sweep_trace(
        tiny_llama,
        TRACE,
        ["window"],
        parse_budgets("0.5", running=True),
        interval=8,
        params={"protect_system": False, "protect_question": False},
    )
    assert [(r["policy"], r["budget"]) for r in rows] == [("full", "100%"), ("window", "50% of seen")]
    events = replay.runs[0].record.events
    assert all(e.kv_tokens == math.ceil(0.5 * (e.positions[-1] + 1)) for e in events if e.compressed)
    assert rows[1]["kv_fraction"] < 0.6


def test_sweep_rows_and_files_are_well_formed(tiny_llama, tmp_path):
    budgets = [Budget(0.5, True), Budget(40, False)]
    seen = []
    rows, replay = sweep_trace(
        tiny_llama,
        TRACE,
        ["window", "h2o"],
        budgets,
        interval=8,
        params={"recent": 4},
        progress=lambda name, done, total: seen.append((done, total)),
    )
    assert [(r["policy"], r["budget"]) for r in rows] == [
        ("full", "100%"),
        ("window", "50%"),
        ("window", "40"),
        ("h2o", "50%"),
        ("h2o", "40"),
    ]
    total = rows[0]["prompt_tokens"] + rows[0]["trace_tokens"]
    assert seen[-1] == (rows[0]["trace_tokens"], rows[0]["trace_tokens"])
    full = rows[0]
    assert full["kv_fraction"] == 1.0 and full["kl"] == 0.0 and full["top1"] == 1.0 and full["nll_delta"] == 0.0
    assert full["peak_kv_bytes"] == total * tiny_llama.geometry.bytes_per_token
    for row in rows[1:]:
        assert set(row) == set(COLUMNS)
        assert row["budget_tokens"] in (round(0.5 * total), 40)
        assert 0 < row["kv_fraction"] < 1 and row["compression"] == pytest.approx(1 / row["kv_fraction"])
        # the cache never holds more than budget + interval slots (protected prompt permitting)
        held = max(row["budget_tokens"] + 8, row["prompt_tokens"] + 8)
        assert row["peak_kv_bytes"] <= held * tiny_llama.geometry.bytes_per_token
        assert row["kl"] > 0 and row["tokens_per_second"] > 0
        assert row["nll"] == pytest.approx(row["nll_full"] + row["nll_delta"])
        assert not math.isnan(row["kl_think"]) and not math.isnan(row["kl_code"])
    assert replay.runs[0].record.summary["fidelity"]["all"]["kl"] == rows[1]["kl"]

    paths = write_rows(rows, tmp_path / "out", {"model": tiny_llama.name})
    with open(paths["csv"], newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == RESULT_COLUMNS  # everything but the timing
        table = list(reader)
    assert len(table) == len(rows)
    assert [float(r["kl"]) for r in table] == pytest.approx([r["kl"] for r in rows])
    doc = json.loads(paths["json"].read_text(encoding="utf-8"))
    results = [{k: row[k] for k in RESULT_COLUMNS} for row in rows]
    assert doc["meta"]["model"] == tiny_llama.name and doc["rows"] == json.loads(json.dumps(results))
    with open(paths["timings"], newline="", encoding="utf-8") as fh:
        timings = list(csv.DictReader(fh))
    assert [(t["trace"], t["policy"], t["budget"]) for t in timings] == [
        (r["trace"], r["policy"], r["budget"]) for r in rows
    ]
    assert [float(t["tokens_per_second"]) for t in timings] == pytest.approx([r["tokens_per_second"] for r in rows])
    table_lines = paths["md"].read_text(encoding="utf-8").splitlines()
    assert len(table_lines) == 2 + len(rows) and table_lines[3].startswith("| tiny | window | 50% |")
    html = paths["html"].read_text(encoding="utf-8")
    assert "Plotly.newPlot" in html and "Pareto front" in html


def _cli(*args):
    """``bench sweep ARGS`` in this process, the embedded model loaded as the CLI loads it (one test
    in ``tests/test_cli.py`` starts ``python -m thinkviz`` itself)."""
    return run_cli("bench", "sweep", *args)


def _refused(*args):
    """``bench sweep ARGS`` in this process, which must refuse them before any model loads."""
    return run_cli("bench", "sweep", *args, before_loading=True)


def _one_line_error(result, reason):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("thinkviz: error:") and reason in lines[0], result.stderr
    assert "Loading" not in result.stderr, "input errors must be caught before the model loads"


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "is empty"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00", "is binary"),
        ("r\u00e9sum\u00e9 \u00e0 la carte".encode("cp1252"), "not UTF-8"),
    ],
)
def test_bad_trace_files_exit_non_zero_before_loading(tmp_path, content, reason):
    path = tmp_path / "trace.md"
    path.write_bytes(content)
    _one_line_error(_refused("--trace", str(path), "--policies", "h2o", "--budgets", "128"), reason)


@pytest.mark.parametrize(
    "args, reason",
    [
        (["--trace", "nowhere.md"], "does not exist"),
        (["--trace", "generate_muffins"], "has no trace"),
        (["--trace", "math_h2o_vs_window", "--budgets", "0.1,2.5"], "(0, 1]"),
        (["--trace", "math_h2o_vs_window", "--policies", "h2o,lru"], "unknown policy 'lru'"),
        (["--trace", "math_h2o_vs_window", "--param", "n_sink=4", "--policies", "h2o"], "no selected policy takes"),
        (["--trace", "math_h2o_vs_window", "--interval", "0"], "--interval"),
    ],
)
def test_bad_arguments_exit_non_zero_before_loading(args, reason):
    _one_line_error(_refused(*args), reason)


@pytest.mark.parametrize("command", ["sweep", "replay-cost"])
def test_a_trace_limit_under_one_is_refused_before_loading(command):
    result = run_cli("bench", command, "--trace", "math_h2o_vs_window", "--max-trace-tokens", "0", before_loading=True)
    _one_line_error(result, "--max-trace-tokens must be at least 1, got 0")


@pytest.mark.integration
def test_a_trace_longer_than_the_context_is_refused(tmp_path):
    path = tmp_path / "long.md"
    path.write_text("<think>\n" + " lorem ipsum" * 6000 + "\n</think>\n", encoding="utf-8")
    result = _cli("--trace", str(path), "--policies", "h2o", "--budgets", "128", "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("thinkviz: error:") and "the model's context is 8192" in last
    assert not (tmp_path / "o").exists()


def test_pareto_front_keeps_only_undominated_points():
    points = [(0.5, 0.2), (0.1, 0.9), (0.25, 0.3), (0.25, 0.5), (0.6, 0.25), (1.0, 0.0), (0.3, float("nan"))]
    assert pareto_front(points) == [1, 2, 0, 5]
    assert pareto_front([(0.1, 0.2), (0.5, 0.9), (0.3, 0.4)], higher_is_better=True) == [0, 2, 1]


def test_pareto_figure_has_one_panel_per_trace_and_one_legend_entry_per_policy():
    rows = [
        {"trace": t, "policy": p, "budget": b, "kv_fraction": f, "kl": k, "nll_delta": k, "top1": 1 - k}
        for t in ("a", "b")
        for p, b, f, k in [("full", "100%", 1.0, 0.0), ("h2o", "10%", 0.1, 0.4), ("window", "10%", 0.1, 0.9)]
    ]
    figure = pareto_figure(rows)
    assert [a.text for a in figure.layout.annotations] == ["a", "b"]
    legend = [t.name for t in figure.data if t.showlegend]
    assert legend == ["full", "h2o", "window", "Pareto front"]
    front = [t for t in figure.data if t.name == "Pareto front"][0]
    assert list(front.x) == [10.0, 100.0] and list(front.y) == [0.4, 0.0]
    with pytest.raises(ValueError, match="metric must be"):
        pareto_figure(rows, metric="speed")


# ---- transcripts -------------------------------------------------------------------------------
def _transcript_file(tmp_path, messages=None):
    from thought_trace import MESSAGES

    path = tmp_path / "agent.json"
    rows = messages if messages is not None else [{"role": r, "content": c} for r, c in MESSAGES]
    path.write_text(json.dumps({"messages": rows}), encoding="utf-8")
    return path


@pytest.mark.slow
def test_sweep_and_replay_cost_on_a_transcript(tiny_llama, tmp_path):
    from thinkviz.bench.replay_cost import measure_replay_cost
    from thinkviz.measure.replay import load_trace, prepare

    trace = load_trace(str(_transcript_file(tmp_path)))
    rows, replay = sweep_trace(tiny_llama, trace, ["window", "think_drop"], [Budget(0.25, True)], interval=8)
    prompt, ids = prepare(tiny_llama, trace)
    assert [r["trace"] for r in rows] == ["agent"] * 3
    assert rows[0]["prompt_tokens"] == len(prompt.ids) and rows[0]["trace_tokens"] == len(ids)
    window = rows[1]
    assert window["kv_fraction"] < 0.6 and window["kl"] > 0 and not math.isnan(window["kl_code"])
    assert replay.runs[0].record.summary["fidelity"]["tool"]["tokens"] > 0
    assert {s["kind"] for s in replay.runs[1].record.segments} >= {"tool", "user", "think"}
    cost = measure_replay_cost(tiny_llama, prompt, ids[:64], "h2o", budget=64, interval=8, repeats=1)
    assert cost.tokens == 64 and cost.replay_seconds > 0 and cost.ratio > 0


@pytest.mark.parametrize(
    "messages, reason",
    [
        (
            [{"role": "user", "content": "q"}, {"role": "narrator", "content": "x"}],
            "message 2 of 2: unknown role 'narrator'",
        ),
        ([{"role": "assistant", "content": "x"}], "message 1 is an assistant message"),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": ["a"]},
                {"role": "user", "content": {}},
            ],
            "message 3 of 3: 'content' must be a string",
        ),
    ],
)
def test_bad_transcripts_exit_non_zero_before_loading(tmp_path, messages, reason):
    path = _transcript_file(tmp_path, messages)
    _one_line_error(_refused("--trace", str(path), "--policies", "h2o", "--budgets", "128"), reason)


@pytest.mark.integration
def test_cli_sweep_and_replay_cost_on_a_transcript_file(tmp_path):
    path = _transcript_file(tmp_path)
    out, first_96 = tmp_path / "o", ["--max-trace-tokens", "96"]
    result = _cli(
        "--trace",
        str(path),
        "--policies",
        "window,think_drop",
        "--budgets",
        "0.5",
        *first_96,
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads((out / "sweep.json").read_text(encoding="utf-8"))
    rows = doc["rows"]
    # the meta says who held the 4-bit weights: NF4 and torch-int4 give different numbers
    assert doc["meta"]["quantization"] == "4bit" and doc["meta"]["backend"] in ("bitsandbytes", "torch-int4")
    assert [(r["trace"], r["policy"], r["trace_tokens"]) for r in rows] == [
        ("agent", "full", 96),
        ("agent", "window", 96),
        ("agent", "think_drop", 96),
    ]
    cost = run_cli("bench", "replay-cost", "--trace", str(path), "--repeats", "1", "--interval", "16", *first_96)
    assert cost.returncode == 0, cost.stderr
    assert "trace agent:" in cost.stdout and "prompt + 96 trace tokens" in cost.stdout and "ratio" in cost.stdout


@pytest.mark.slow
def test_sweep_adds_a_kv_format_dimension_against_the_full_precision_reference(tiny_llama_d32, tmp_path):
    formats = parse_kv_quants("none, q8_0,q4_0,q8_0")
    assert formats == [KVQuant("none"), KVQuant("q8_0"), KVQuant("q4_0")]
    rows, replay = sweep_trace(tiny_llama_d32, TRACE, ["window"], [Budget(0.5, True)], interval=8, kv_quants=formats)
    assert [(r["policy"], r["budget"], r["kv_quant"]) for r in rows] == [
        ("full", "100%", "none"),
        ("full", "100%", "q8_0"),
        ("full", "100%", "q4_0"),
        ("window", "50%", "none"),
        ("window", "50%", "q8_0"),
        ("window", "50%", "q4_0"),
    ]
    assert replay.reference.record.meta["kv_quant"]["format"] == "none"
    full, full_q8, full_q4 = rows[:3]
    # every token kept, fewer bits: a float32 model stores 8.5 (q8_0) and 4.5 (q4_0) of 32 bits
    assert full_q8["kv_fraction"] == pytest.approx(8.5 / 32) and full_q4["kv_fraction"] == pytest.approx(4.5 / 32)
    assert 0 < full_q8["kl"] < full_q4["kl"]
    window, window_q4 = rows[3], rows[5]
    assert window_q4["kv_fraction"] == pytest.approx(window["kv_fraction"] * 4.5 / 32)
    paths = write_rows(rows, tmp_path, {})
    with open(paths["csv"], newline="", encoding="utf-8") as fh:
        assert [r["kv_quant"] for r in csv.DictReader(fh)] == ["none", "q8_0", "q4_0", "none", "q8_0", "q4_0"]
    lines = paths["md"].read_text(encoding="utf-8").splitlines()
    assert "| KV |" in lines[0] and lines[4].startswith("| tiny | full | 100% | q4_0 |")
    figure = pareto_figure(rows)
    legend = [t.name for t in figure.data if t.showlegend]
    assert legend == ["full", "full · q8_0", "full · q4_0", "window", "window · q8_0", "window · q4_0", "Pareto front"]
    assert [t.marker.symbol for t in figure.data[:3]] == ["circle", "square", "diamond"]


def test_sweep_tables_without_formats_keep_their_columns(tiny_llama):
    rows, _ = sweep_trace(tiny_llama, TRACE, ["window"], [Budget(0.5, True)], interval=8)
    assert all(r["kv_quant"] == "none" for r in rows)
    assert "| KV |" not in markdown_table(rows).splitlines()[0]


@pytest.mark.parametrize(
    "args, reason",
    [
        (["--kv-quants", "none,q5_1"], "unknown KV format 'q5_1'"),
        (["--kv-quants", "kivi2", "--kv-residual", "4"], "residual must be between 8 and 512"),
        (["--kv-quants", " , "], "no KV formats given"),
    ],
)
def test_bad_kv_formats_exit_non_zero_before_loading(args, reason):
    _one_line_error(_refused("--trace", "math_h2o_vs_window", *args), reason)
