"""Plotly figures on real records (a tiny random Llama run by the engine) and constructed cases."""

from __future__ import annotations

import dataclasses

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from thinkviz.core.events import RunRecord, StepEvent
from thinkviz.core.kvquant import KVQuant
from thinkviz.memory import GIB, TARGETS, Projection, TargetModel
from thinkviz.units import format_bytes
from thinkviz.viz.tables import stats_strip
from thinkviz.viz.compare_chart import coinciding, compare_memory_figure
from thinkviz.viz.figures import MIB, placeholder_figure, streamed
from thinkviz.viz.keep_maps import MAX_COLS, MAX_ROWS, keep_heatmap, keep_matrix, kept_figure
from thinkviz.viz.memory_chart import memory_figure
from thinkviz.viz.memory_projection import growth_rate, projection_outcome
from thinkviz.viz.run_series import bytes_per_token, device_cap, oom_step, tokens_seen
from viz_records import generated, replayed
from tiny_models import tiny_model


@pytest.fixture(scope="module")
def loaded():
    # the tiny_llama fixture's model, built once for the module (the fixture is per test)
    return tiny_model("llama")


@pytest.fixture(scope="module")
def h2o_run(loaded):
    return generated(loaded, "h2o", recent=4)


@pytest.fixture(scope="module")
def replay_run(loaded):
    return replayed(loaded, "h2o", recent=4)


def traces(fig):
    return {t.name: t for t in fig.data}


def one_kv_head_model(bytes_per_token_target: int) -> TargetModel:
    """A target whose bytes per token is exactly ``bytes_per_token_target`` (1 layer, head_dim = bytes/8)."""
    return TargetModel(
        "Toy",
        layers=1,
        q_heads=1,
        kv_heads=1,
        head_dim=bytes_per_token_target // 4,
        hidden=8,
        intermediate=8,
        vocab=8,
        tied_embeddings=True,
    )


# ---- memory ------------------------------------------------------------------------
def test_memory_figure_draws_the_recorded_bytes(h2o_run, loaded):
    record = h2o_run.record
    fig = memory_figure(record, show_device=True)  # (#22: process memory and weights are off by default)
    lines = traces(fig)
    x = tokens_seen(record)
    assert list(x) == [e.positions[-1] + 1 for e in record.events]
    np.testing.assert_allclose(lines["KV cache (physical)"].x, x)
    np.testing.assert_allclose(lines["KV cache (physical)"].y, record.kv_bytes_series() / MIB)
    np.testing.assert_allclose(lines["full cache (no eviction)"].y, record.full_kv_bytes_series() / MIB)
    assert bytes_per_token(record) == loaded.geometry.bytes_per_token
    budget = lines["budget (20 tokens)"]
    assert budget.y[0] == pytest.approx(20 * loaded.geometry.bytes_per_token / MIB)
    weights = [t for name, t in lines.items() if name.startswith("weights (none")]
    assert weights and weights[0].y[0] == pytest.approx(loaded.weights_bytes / MIB)
    assert weights[0].yaxis == "y2"  # device-scale numbers live on the second axis
    # eviction really happened: the physical curve stays near the budget while the full one grows
    assert lines["KV cache (physical)"].y[-1] < lines["full cache (no eviction)"].y[-1]


def test_memory_figure_full_policy_has_no_budget_line(loaded):
    record = generated(loaded, "full", steps=6).record
    names = set(traces(memory_figure(record)))
    assert not any(name.startswith("budget") for name in names)
    np.testing.assert_allclose(record.kv_bytes_series(), record.full_kv_bytes_series())


def test_memory_figure_device_series_from_ui_samples_or_events(h2o_run, tmp_path):
    record = h2o_run.record
    sampled = {e.step: {"kind": "cpu", "rss": 1000 * MIB + e.step * MIB} for e in record.events if e.step % 10 == 0}
    rss = traces(memory_figure(record, device_stats=sampled, show_device=True))["process RSS"]
    assert rss.yaxis == "y2"
    measured = ~np.isnan(np.asarray(rss.y, dtype=float))
    assert measured.sum() == len(sampled)
    np.testing.assert_allclose(np.asarray(rss.y, dtype=float)[measured], [1000 + s for s in sorted(sampled)])

    copy = RunRecord.load(record.save(tmp_path / "run")[0])  # a loaded recording, per-step stats in info
    for event in copy.events:
        event.info["device_memory"] = {"kind": "cuda", "allocated": 5 * MIB, "reserved": 8 * MIB}
    lines = traces(memory_figure(copy, show_device=True))
    assert np.allclose(lines["GPU allocated"].y, 5) and np.allclose(lines["GPU reserved"].y, 8)


def test_a_vram_cap_is_drawn_with_where_a_full_cache_reaches_it(h2o_run, tmp_path):
    record = RunRecord.load(h2o_run.record.save(tmp_path / "run")[0])
    per_token = bytes_per_token(record)
    besides, cap = 300 * MIB, 300 * MIB + 200 * per_token  # room for 200 tokens of cache
    for event in record.events:
        event.info["device_memory"] = {
            "kind": "cuda",
            "allocated": besides + event.kv_bytes,
            "reserved": besides + event.kv_bytes,
            "cap": cap,
        }
    assert device_cap(record) == cap
    lines = traces(memory_figure(record))
    cap_line = lines[f"VRAM cap ({format_bytes(cap)})"]
    assert cap_line.yaxis == "y2" and list(cap_line.y) == [cap / MIB] * 2
    projected = lines["full cache on this device (projected)"]
    assert projected.x[-1] == pytest.approx(200) and projected.y[-1] == pytest.approx(cap / MIB)
    assert projected.x[0] == tokens_seen(record)[0]
    assert cap_line.x[-1] == max(tokens_seen(record)[-1], 200)


def test_no_cap_no_cap_line(h2o_run):
    assert device_cap(h2o_run.record) is None
    device_stats = {0: {"kind": "cuda", "allocated": 1, "reserved": 2}}
    names = set(traces(memory_figure(h2o_run.record, device_stats=device_stats)))
    assert not any(name.startswith("VRAM cap") for name in names)


def test_oom_step():
    full = np.array([1, 2, 3, 4, 5])
    assert oom_step(full, np.array([1, 2, 2, 2, 2]), 2.5) == 2
    assert oom_step(full, np.array([1, 2, 3, 3, 3]), 2.5) is None  # the policy does not fit either
    assert oom_step(full, full, 10) is None


def test_projection_marks_where_the_full_cache_runs_out(h2o_run):
    record = h2o_run.record
    x = tokens_seen(record)
    kept = np.array([e.kv_tokens for e in record.events])
    target = one_kv_head_model(1024)
    assert target.bytes_per_token == 1024
    # a card with room for exactly `room` tokens after the weights: more than the policy keeps,
    # fewer than the run sees by its end
    room = int(kept.max()) + 3
    assert x[-1] > room
    card = (target.weights_bytes(4) + room * 1024) / GIB
    projection = Projection(target, card, 4)
    assert projection.max_tokens == room
    fig = memory_figure(record, projection=projection)
    lines = traces(fig)
    marker = lines["full cache out of memory"]
    first = int(np.flatnonzero(x > room)[0])
    assert list(marker.x) == [x[first]]
    assert marker.y[0] == pytest.approx(x[first] * 1024 / GIB)
    np.testing.assert_allclose(lines["policy on Toy"].y, kept * 1024 / GIB)
    np.testing.assert_allclose(lines["full cache on Toy"].y, x * 1024 / GIB)
    available = [t for name, t in lines.items() if "card − weights" in name][0]
    assert available.y[0] == pytest.approx(room * 1024 / GIB)
    notes = [a.text for a in fig.layout.annotations]
    assert f"full cache runs out of memory at {x[first]:,} tokens; the policy still fits" in notes


def test_projection_without_oom_and_without_room(h2o_run):
    record = h2o_run.record
    roomy = memory_figure(record, projection=Projection.named("Qwen3-4B", 24))
    assert "full cache out of memory" not in traces(roomy)
    fits = Projection.named("Qwen3-4B", 24).max_tokens
    assert f"a full cache fits {fits:,} tokens on this card" in [a.text for a in roomy.layout.annotations]
    too_small = memory_figure(record, projection=Projection.named("Llama-3.1-8B", 6, weights_bits=16))
    assert any("do not fit this card" in (a.text or "") for a in too_small.layout.annotations)


def test_compare_memory_figure_overlays_runs(loaded, h2o_run):
    window = generated(loaded, "window", steps=25)
    fig = compare_memory_figure({"h2o": h2o_run.record, "window": window.record})
    lines = traces(fig)
    assert set(lines) == {"full cache", "h2o", "window"}
    np.testing.assert_allclose(lines["window"].y, window.record.kv_bytes_series() / MIB)
    np.testing.assert_allclose(lines["full cache"].y, h2o_run.record.full_kv_bytes_series() / MIB)  # the longer run
    assert len(compare_memory_figure({}).data) == 0


def test_compare_lines_for_equal_memory_policies_all_stay_visible(loaded):
    # a budget above the run: window, streaming and h2o hold the same memory at every step
    runs = {name: generated(loaded, name, steps=12, budget=200).record for name in ("window", "streaming", "h2o")}
    fig = compare_memory_figure(runs)
    lines = traces(fig)
    assert set(lines) == {"full cache", "window", "streaming", "h2o"}
    styles = [(lines[n].line.dash, lines[n].marker.symbol) for n in runs]
    assert len(set(styles)) == 3  # each its own dash and marker
    widths = [lines[n].line.width for n in runs]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]  # the first drawn widest, under the rest
    notes = [a.text for a in fig.layout.annotations]
    assert "same memory at every step: full cache = window = streaming = h2o" in notes
    series = {"a": (np.arange(3), np.ones(3)), "b": (np.arange(3), np.ones(3)), "c": (np.arange(3), np.zeros(3))}
    assert coinciding(series) == [["a", "b"]]


def test_the_projection_note_names_a_policy_that_does_not_hold_its_budget(loaded):
    # think_drop on a chat without think blocks may evict nothing: its cache grows like the full one
    record = generated(loaded, "think_drop", steps=30).record
    x = tokens_seen(record)
    target = one_kv_head_model(1024)
    room = int(x[len(x) // 2])  # the card fills halfway through the run
    projection = Projection(target, (target.weights_bytes(4) + room * 1024) / GIB, 4)
    outcome = projection_outcome(record, projection)
    assert outcome.growth == pytest.approx(1.0) and outcome.policy_oom == outcome.full_oom
    fig = memory_figure(record, projection=projection)
    notes = [a.text for a in fig.layout.annotations]
    assert not any("still fits" in (n or "") for n in notes)
    assert f"think_drop runs out too, at {outcome.policy_oom:,.0f} tokens" in " ".join(n or "" for n in notes)
    assert "think_drop out of memory" in traces(fig)
    # with room past the run's end, its growth is extrapolated to where it would run out
    later = Projection(target, (target.weights_bytes(4) + 4 * int(x[-1]) * 1024) / GIB, 4)
    ahead = projection_outcome(record, later)
    assert ahead.policy_oom == pytest.approx(4 * x[-1], rel=0.05) and ahead.horizon >= ahead.policy_oom
    text = " ".join(a.text or "" for a in memory_figure(record, projection=later).layout.annotations)
    assert "think_drop fits to the end of the run but keeps growing" in text and "(extrapolated)" in text


def test_a_sawtooth_that_holds_its_budget_does_not_grow():
    # budget 96, compressed every 8 tokens: up one token per token, back to 96 at each compression;
    # a run that ends at a peak has a rising least-squares slope, but the cache does not grow
    seen = np.arange(125, 157)
    sawtooth = 96 + (seen - 125) % 8
    half = slice(len(seen) // 2, None)
    assert np.polyfit(seen[half], sawtooth[half], 1)[0] > 0.01
    assert growth_rate(seen, sawtooth) == 0
    # a budget that is a fraction of the tokens seen: the counts after each compression rise with it
    fraction = (seen // 8 * 8 * 0.5).astype(int) + (seen - 125) % 8
    assert growth_rate(seen, fraction) == pytest.approx(0.5, abs=0.05)
    assert growth_rate(seen, seen) == pytest.approx(1.0)  # never compressed: the full cache's slope


def test_the_projection_extrapolates_the_full_cache_past_the_run_to_where_it_runs_out(h2o_run):
    record = h2o_run.record
    projection = Projection.named("Qwen3-4B", 8)
    outcome = projection_outcome(record, projection)
    assert outcome.full_oom == projection.max_tokens and outcome.full_oom > outcome.end
    assert outcome.policy_oom is None and not outcome.grows and outcome.reached  # h2o holds its cap
    fig = memory_figure(record, projection=projection)
    lines = traces(fig)
    extra = lines["full cache, extrapolated"]
    assert extra.line.dash == "dot" and list(extra.x) == [outcome.end, outcome.horizon]
    assert extra.y[-1] == pytest.approx(projection.kv_bytes(outcome.horizon) / GIB)
    assert list(lines["full cache out of memory (extrapolated)"].x) == [projection.max_tokens]
    notes = [a.text for a in fig.layout.annotations]
    assert (
        f"a full cache would run out of memory at {projection.max_tokens:,} tokens (extrapolated: this run saw "
        f"{outcome.end:,})" in notes
    )
    assert any(n.startswith("h2o holds at most") and n.endswith("and fits") for n in notes if n)
    assert "end of this run" in notes
    assert not any(t.name and t.name.startswith(("process", "weights")) for t in fig.data)  # off by default


# ---- keep heatmap --------------------------------------------------------------------
def test_keep_matrix_average_is_the_events_keep_fraction(replay_run):
    record = replay_run.record
    matrix = keep_matrix(record)
    assert matrix.shape == (len(record.events), len(record.texts))
    for i, event in enumerate(record.events):
        seen = len(event.keep_fraction)
        np.testing.assert_allclose(matrix[i, :seen], event.keep_fraction)
        assert np.isnan(matrix[i, seen:]).all()
    assert (matrix == 0).any()  # something was evicted


def test_keep_matrix_per_layer_and_head_uses_the_snapshot_at_or_before(replay_run):
    record = replay_run.record
    steps = sorted(record.snapshots)
    assert len(steps) >= 2 and steps[0] == 0
    matrix = keep_matrix(record, layer=1, head=0)
    for i, event in enumerate(record.events):
        snap = max(s for s in steps if s <= event.step)
        mask = record.snapshots[snap][1, 0]
        np.testing.assert_array_equal(matrix[i, : len(mask)], mask.astype(np.float32))
        assert np.isnan(matrix[i, len(mask) :]).all()
    layer_mean = keep_matrix(record, layer=0)
    np.testing.assert_allclose(layer_mean[0, : record.snapshots[0].shape[-1]], record.snapshots[0][0].mean(axis=0))


def test_keep_matrix_refuses_bad_layer_head_and_missing_snapshots(replay_run):
    record = replay_run.record
    with pytest.raises(ValueError, match="layer must be between 0 and 1, got 2"):
        keep_matrix(record, layer=2)
    with pytest.raises(ValueError, match="head must be between 0 and 1, got -1"):
        keep_matrix(record, head=-1)
    bare = RunRecord(meta=record.meta, prompt_texts=record.prompt_texts, events=record.events)
    with pytest.raises(ValueError, match="no per-layer snapshots"):
        keep_matrix(bare, layer=0)


def test_keep_heatmap_outlines_think_blocks(replay_run):
    record = replay_run.record
    fig = keep_heatmap(record)
    think = [s for s in record.segments if s["kind"] == "think"]
    assert len(think) == 2
    assert [(s.x0, s.x1) for s in fig.layout.shapes] == [(t["start"] - 0.5, t["end"] - 0.5) for t in think]
    heat = fig.data[0]
    assert heat.z.shape == (len(record.events), len(record.texts))
    assert list(heat.y) == [e.step for e in record.events]


def _synthetic_record(steps: int, first: int, kept_below: int) -> RunRecord:
    """``steps`` events over ``first + s`` tokens, positions below ``kept_below`` kept, the rest evicted."""
    events = []
    for s in range(steps):
        seen = first + s
        keep = (np.arange(seen) < kept_below).astype(np.float32)
        events.append(
            StepEvent(
                step=s,
                token_ids=[0],
                texts=["x"],
                positions=[seen - 1],
                scores=np.zeros(seen, np.float32),
                keep_fraction=keep,
            )
        )
    meta = {"geometry": {"layers": 1, "kv_heads": 1, "head_dim": 1, "dtype_bytes": 1}, "budget": 1, "policy": "h2o"}
    return RunRecord(meta=meta, prompt_texts=["x"] * (first - 1), events=events)


def test_large_heatmaps_are_downsampled_and_stay_light():
    record = _synthetic_record(steps=900, first=2600, kept_below=1000)
    fig = keep_heatmap(record)
    z = np.asarray(fig.data[0].z)
    assert z.shape[0] <= MAX_ROWS and z.shape[1] <= MAX_COLS
    x = np.asarray(fig.data[0].x)
    inside = x + (3500 / MAX_COLS) < 1000  # bins wholly below the kept boundary
    assert np.all(z[:, inside] == 1.0)
    beyond = (x > 1000) & (x + 3500 / MAX_COLS < 2600)  # evicted and seen from the first step on
    assert np.all(z[:, beyond] == 0.0)
    assert np.isnan(z[0, -1]) and not np.isnan(z[-1, -1])  # the last positions arrive late
    assert len(fig.to_json()) < 3_000_000


def test_figures_before_the_first_step():
    meta = {
        "geometry": {"layers": 2, "kv_heads": 2, "head_dim": 16, "dtype_bytes": 4},
        "budget": 8,
        "policy": "h2o",
        "weights_bytes": 1000,
        "quantization": "none",
    }
    record = RunRecord(meta=meta, prompt_texts=["a", "b"])
    fig = memory_figure(record, projection=Projection.named("Qwen3-4B", 8))
    assert all(len(t.x) == 0 for t in fig.data)
    assert keep_heatmap(record).data[0].z.shape == (0, 2)
    assert len(compare_memory_figure({"h2o": record}).data[0].x) == 0


def test_charts_a_run_redraws_are_cheap_to_redraw_and_look_the_same(h2o_run, loaded):
    window = generated(loaded, "window")
    figures = [
        memory_figure(h2o_run.record, projection=Projection.named("Qwen3-4B", 8), show_device=True),
        compare_memory_figure({"h2o": h2o_run.record, "window": window.record}),
    ]
    default = pio.templates[pio.templates.default]
    for fig in figures:
        axes = [fig.layout[name] for name in fig.layout if name.startswith(("xaxis", "yaxis"))]
        assert len(axes) >= 2 and all(axis.ticklabeloverflow == "allow" for axis in axes)
        template = fig.layout.template
        assert template.layout == default.layout  # the look: colours, grid, fonts
        assert [t for t in template.data.to_plotly_json() if template.data[t]] == ["scatter"]
        assert {trace.type for trace in fig.data} == {"scatter"}


def test_streamed_makes_any_figure_cheap_to_redraw():
    fig = streamed(go.Figure(go.Scatter(x=[1, 2], y=[3, 4])))
    assert fig.layout.xaxis.ticklabeloverflow == "allow" and fig.layout.yaxis.ticklabeloverflow == "allow"
    assert fig.layout.template.data.scatter == pio.templates[pio.templates.default].data.scatter
    assert not fig.layout.template.data.heatmap  # the default template has defaults for every trace type


def test_placeholder_figure_shows_only_its_hint():
    fig = placeholder_figure("Each policy's KV cache appears here")
    assert len(fig.data) == 0
    assert [a.text for a in fig.layout.annotations] == ["Each policy's KV cache appears here"]
    assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False


def test_keep_heatmap_marks_where_each_turn_of_a_transcript_begins(loaded, tmp_path):
    from thinkviz.core.engine import DecodeSettings, Run
    from thinkviz.core.events import RunRecord
    from thinkviz.policies import make_policy
    from thinkviz.viz.keep_maps import turn_starts

    from thought_trace import conversation_and_trace

    prompt, ids = conversation_and_trace(loaded)
    run = Run(loaded, make_policy("window", budget=64, interval=8), prompt, DecodeSettings(snapshot_limit=8))
    for _ in run.replay(ids):
        pass
    record = run.record
    starts = turn_starts(record.segments)
    assert starts == [(r.start, r.role) for r in prompt.roles]
    fig = keep_heatmap(record)
    (turns,) = [t for t in fig.data if t.name == "turns"]
    assert [x for x in turns.x if x is not None][::2] == [start - 0.5 for start, _ in starts[1:]]
    assert [t for t in turns.text if t] == [role for _, role in starts[1:]]
    record.save(tmp_path / "run")  # a recording keeps the turns and the tool spans
    again = RunRecord.load(tmp_path / "run")
    assert again.segments == record.segments and turn_starts(again.segments) == starts
    assert {s["kind"] for s in again.segments} >= {"tool", "assistant"}
    # a single-turn chat: system, user, then the open assistant turn after them
    single = turn_starts(replayed(loaded, "window").record.segments)
    assert [role for _, role in single] == ["system", "user", "assistant"]


def _ragged_record(kept: list[np.ndarray], padded_bytes: int = 0, params: dict | None = None) -> RunRecord:
    """One event per ``(L, H_kv)`` kept array; physical bytes = logical + ``padded_bytes``."""
    events = []
    for s, counts in enumerate(kept):
        seen = 40 + s
        logical = int(counts.sum()) * 8
        events.append(
            StepEvent(
                step=s,
                token_ids=[0],
                texts=["x"],
                positions=[seen - 1],
                scores=np.zeros(seen, np.float32),
                keep_fraction=np.ones(seen, np.float32),
                kv_bytes=logical + padded_bytes,
                logical_kv_bytes=logical,
                kv_tokens=round(counts.mean()),
                kept=counts,
            )
        )
    meta = {
        "geometry": {"layers": 3, "kv_heads": 2, "head_dim": 2, "dtype_bytes": 2},
        "budget": 16,
        "policy": "adakv",
        "params": params or {"budget_mode": "tokens"},
    }
    return RunRecord(meta=meta, prompt_texts=["x"] * 39, events=events)


def test_kept_figure_shows_each_layer_and_head_and_falls_back_to_kv_tokens():
    counts = np.array([[20, 12], [16, 16], [9, 23]])
    fig = kept_figure(_ragged_record([counts]), 0)
    np.testing.assert_array_equal(np.asarray(fig.data[0].z), counts)
    assert "mean 16.0, total 96" in fig.layout.title.text
    old = _ragged_record([counts])
    old.events[0].kept = None  # a recording from before per-layer budgets
    np.testing.assert_array_equal(np.asarray(kept_figure(old, 0).data[0].z), np.full((3, 2), 16))


def test_memory_figure_draws_logical_bytes_only_when_padding_exists():
    counts = np.array([[20, 12], [16, 16], [9, 23]])
    names = [t.name for t in memory_figure(_ragged_record([counts, counts], padded_bytes=64)).data]
    assert "KV cache (physical, padding included)" in names and "KV cache (logical: tokens held)" in names
    names = [t.name for t in memory_figure(_ragged_record([counts, counts])).data]
    assert "KV cache (physical)" in names and not any("logical" in n for n in names)


def test_a_fractional_budget_line_grows_with_the_tokens_seen():
    counts = np.full((3, 2), 10)
    record = _ragged_record([counts] * 5, params={"budget_mode": "fraction", "budget_fraction": 0.25})
    budget = next(t for t in memory_figure(record).data if t.name.startswith("budget"))
    assert budget.name == "budget (25% of the tokens seen)"
    seen = tokens_seen(record)
    np.testing.assert_allclose(np.asarray(budget.y), np.ceil(0.25 * seen) * bytes_per_token(record) / MIB)


def test_a_quantized_run_prices_its_budget_and_projection_in_its_format():
    loaded = tiny_model("llama", hidden=128)  # head_dim 32: one q4_0 block per head
    record = generated(loaded, "h2o", steps=30, kv_quant=KVQuant("q4_0"), recent=4).record
    lines = traces(memory_figure(record, projection=Projection.named("Qwen3-4B", 8)))
    geometry = loaded.geometry
    per_token = geometry.layers * 2 * geometry.kv_heads * (geometry.head_dim // 32) * 18  # 18 bytes a block
    assert lines["budget (20 tokens, q4_0)"].y[0] == pytest.approx(20 * per_token / MIB)
    np.testing.assert_allclose(lines["KV cache (physical, q4_0)"].y, record.kv_bytes_series() / MIB)
    full = lines["full cache (no eviction, full precision)"].y
    np.testing.assert_allclose(full, tokens_seen(record) * geometry.bytes_per_token / MIB)
    qwen = TARGETS["Qwen3-4B"]
    kept = np.array([e.kv_tokens for e in record.events])
    np.testing.assert_allclose(
        lines["policy on Qwen3-4B (q4_0)"].y, kept * qwen.layers * 2 * qwen.kv_heads * (qwen.head_dim // 32) * 18 / GIB
    )
    np.testing.assert_allclose(lines["full cache on Qwen3-4B"].y, tokens_seen(record) * qwen.bytes_per_token / GIB)
    assert stats_strip(record)["KV format"] == "q4_0"
    assert "KV format" not in stats_strip(generated(loaded, "h2o", steps=2, recent=4).record)


def test_a_recording_with_an_unknown_kv_format_is_drawn_at_full_precision(h2o_run):
    record = dataclasses.replace(h2o_run.record, meta={**h2o_run.record.meta, "kv_quant": {"format": "q9_9"}})
    assert "budget (20 tokens)" in traces(memory_figure(record))
    assert "KV format" not in stats_strip(record)


def test_the_projection_of_a_quantized_cache_runs_out_where_its_format_fills_the_card():
    loaded = tiny_model("llama", hidden=128)  # head_dim 32
    q4 = KVQuant("q4_0")
    record = generated(loaded, "full", steps=30, kv_quant=q4).record
    x = tokens_seen(record)
    target = one_kv_head_model(1024)  # head_dim 256: 1024 bytes a token in bf16, 288 in q4_0
    room = int(x[len(x) // 2])  # a full-precision full cache fills the card halfway through the run
    projection = Projection(target, (target.weights_bytes(4) + room * 1024) / GIB, 4)
    outcome = projection_outcome(record, projection)
    assert outcome.compressed and outcome.policy == "full (q4_0)"
    assert outcome.policy_room == projection.tokens_fitting(q4) > x[-1] > outcome.full_oom
    assert outcome.policy_oom == pytest.approx(outcome.policy_room, abs=1)  # grows a token per token seen
    fig = memory_figure(record, projection=projection)
    text = " ".join(a.text or "" for a in fig.layout.annotations)
    assert f"full cache runs out of memory at {outcome.full_oom:,.0f} tokens" in text
    assert "full (q4_0) fits to the end of the run but keeps growing" in text
    assert "full (q4_0) out of memory (extrapolated)" in traces(fig)
    evicting = generated(loaded, "h2o", steps=30, kv_quant=q4, recent=4).record
    held = projection_outcome(evicting, projection)
    # held at its cap: what a compression keeps and the token read before the next (interval 1)
    assert held.policy_oom is None and held.kept_bytes == projection.kv_bytes(held.kept_end + 1, q4)
    assert held.notes() == [f"full cache runs out of memory at {held.full_oom:,.0f} tokens; the policy still fits"]
    later = Projection(target, (target.weights_bytes(4) + 4 * int(x[-1]) * 1024) / GIB, 4)
    assert f"h2o (q4_0) holds at most {held.kept_end + 1:,} tokens" in " ".join(
        projection_outcome(evicting, later).notes()
    )
