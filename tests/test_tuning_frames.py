"""The tuning loop's frames on a tiny model: fidelity in Live, the same policy twice in Compare, the first
N trace tokens, the estimate in the status line, and a recording played through the same frames."""

from __future__ import annotations

import json
import math
import threading
from functools import partial

import pytest

from thinkviz.measure.comparison import Column, column_labels
from thinkviz.core.engine import DecodeSettings
from thinkviz.measure.estimate import Speed
from thinkviz.policies import make_policy
from thinkviz.demos.playback import Playback
from thinkviz.demos.recordings import load, save
from thinkviz.ui import explore_views
from thinkviz.ui import live_run as live_tab
from thinkviz.ui.compare_run import charts as compare_charts
from thinkviz.ui.compare_run import compare_frames
from thinkviz.ui.compare_run import playback_frames as compare_playback
from thinkviz.demos.record import PresetRequest, record
from thinkviz.measure.requests import decode_settings
from thinkviz.ui.live_run import live_frames, playback_frames
from thinkviz.measure.requests import RunInput, RunInputError
from thinkviz.ui.stream import TokenChannel
from thinkviz.ui import shared_charts
from thinkviz.demos.shared import SharedBuilds
from thinkviz.ui.shared_charts import chart_position
from thinkviz.ui.throttle import FramePacer
from thinkviz.viz.tokens import render_tokens
from tiny_models import tiny_model

TRACE_TEXT = (
    "<think>\nFirst add 1 and 2 to get 3.\n\nThen add 3 to get 6.\n\nCheck: 1 + 2 + 3 = 6.\n</think>\n\nThe sum is 6.\n"
) * 2
TRACE = RunInput(system=None, question="Sum the list 1, 2, 3.", trace=TRACE_TEXT)
QUESTION = RunInput(system="Think step by step.", question="What is 2 + 3?")


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama")


def _live(tiny, run_input, **kwargs):
    settings = DecodeSettings(max_new_tokens=12, stop_at_eos=False)
    policy = make_policy("h2o", budget=24, interval=4, recent=4)
    return list(
        live_frames(
            tiny,
            policy,
            run_input,
            settings,
            threading.Event(),
            TokenChannel("t"),
            None,
            FramePacer(0.0),
            FramePacer(0.0),
            **kwargs,
        )
    )


@pytest.mark.slow
def test_live_measures_a_replay_against_the_full_cache_as_it_goes(tiny):
    frames = _live(tiny, TRACE, measure=True)
    measured = [f for f in frames if "ΔNLL" in f.stats]
    assert measured and measured[0] is not frames[-1]  # fidelity shows while the replay streams
    final = frames[-1]
    assert "KL" in final.stats and final.fidelity is not None
    assert {trace.name for trace in final.fidelity.data} == {"h2o"}
    assert final.status.startswith("Done:")


def test_live_measures_a_generation_afterwards_on_its_own_text(tiny):
    frames = _live(tiny, QUESTION, measure=True)
    assert any(f.status.startswith("Measuring fidelity") for f in frames)
    assert "ΔNLL" in frames[-1].stats and frames[-1].fidelity is not None
    plain = _live(tiny, QUESTION)
    assert "ΔNLL" not in plain[-1].stats and plain[-1].fidelity is None


def test_live_replays_only_the_first_trace_tokens(tiny):
    whole = _live(tiny, TRACE)[-1].record
    first = _live(tiny, RunInput(TRACE.system, TRACE.question, TRACE.trace, max_tokens=10))[-1].record
    assert len(first.texts) - len(first.prompt_texts) == 10
    assert len(whole.texts) - len(whole.prompt_texts) > 40


def test_the_status_line_prices_the_run_then_counts_down(tiny):
    speed = Speed(base=0.02, per_token=0.002)
    frames = _live(tiny, TRACE, speed=speed)
    assert "in all on this machine" in frames[0].status
    assert any(" left" in f.status for f in frames[1:-1])
    assert frames[-1].status.startswith("Done:") and " in " in frames[-1].status
    assert speed.correction != 1.0  # the run's own time corrected the next estimate


def test_compare_takes_the_same_policy_twice_titled_by_what_differs(tiny):
    columns = [Column(make_policy("h2o", budget=24, interval=4, recent=recent)) for recent in (2, 12)]
    assert column_labels(columns) == ["h2o · recent 2", "h2o · recent 12"]
    channels = [TokenChannel(f"c{i}") for i in range(6)]
    settings = DecodeSettings(max_new_tokens=16, stop_at_eos=False)
    frames = list(compare_frames(tiny, columns, TRACE, settings, threading.Event(), channels, True, FramePacer(0.0)))
    final = frames[-1]
    assert list(final.records) == ["h2o · recent 2", "h2o · recent 12"]
    assert [row[0] for row in final.table] == ["h2o · recent 2", "h2o · recent 12"]
    assert "h2o · recent 12" in final.headers[1]
    kept = [[e.keep_fraction.tolist() for e in r.events] for r in final.records.values()]
    assert kept[0] != kept[1]  # the knob made a difference


def test_compare_refuses_two_identical_columns(tiny):
    columns = [Column(make_policy("h2o", budget=64)), Column(make_policy("h2o", budget=64))]
    with pytest.raises(RunInputError, match="the same h2o with the same knobs"):
        list(
            compare_frames(
                tiny,
                columns,
                QUESTION,
                DecodeSettings(max_new_tokens=2),
                threading.Event(),
                [TokenChannel("a"), TokenChannel("b")],
            )
        )


@pytest.fixture(scope="module")
def recording(tiny, tmp_path_factory):
    knobs = {"budget": 24, "interval": 4}
    columns = [Column(make_policy("window", **knobs)), Column(make_policy("h2o", recent=4, **knobs))]
    request = PresetRequest("tiny_demo", "replay", TRACE, decode_settings(16, 0.0, True), columns[1], columns)
    return load(save(record(tiny, request), tmp_path_factory.mktemp("rec") / "tiny_demo.zip"))


@pytest.mark.slow
def test_a_recording_plays_through_the_live_frames_to_the_view_explore_shows(recording):
    frames = list(playback_frames(recording, math.inf, threading.Event(), TokenChannel("t"), None, FramePacer(0.0)))
    final = frames[-1]
    assert final.done and final.status.startswith("Done: ") and "no model needed" in final.status
    assert len(frames) > 5 and all("▶ Recording" in f.status for f in frames[:-1])
    live = recording.records[recording.live]
    last = len(live.events) - 1
    shown = explore_views.explore_view(live, last, explore_views.AVERAGE, explore_views.AVERAGE, "combined")
    assert render_tokens(final.view, "combined") == shown.tokens_html
    assert "ΔNLL" in final.stats  # Live's run was recorded with its fidelity
    growing = [len(f.view.texts) for f in frames]  # the record grows in place; each frame's view is its own
    assert growing == sorted(growing) and growing[0] == len(live.prompt_texts) < growing[-1] == len(live.texts)


def test_a_recording_plays_through_the_compare_frames(recording):
    channels = [TokenChannel(f"c{i}") for i in range(6)]
    frames = list(compare_playback(recording, math.inf, threading.Event(), channels, FramePacer(0.0)))
    final = frames[-1]
    assert final.done and list(final.records) == recording.labels
    for label, rec in zip(recording.labels, recording.records):
        assert len(final.records[label].events) == len(rec.events)
    assert all(row[2] != "—" for row in final.table)  # ΔNLL filled in from the recorded fidelity


def test_stopping_a_playback_ends_it_with_a_final_frame(recording):
    cancel = threading.Event()
    frames = playback_frames(recording, 1000.0, cancel, TokenChannel("t"), None, FramePacer(0.0))
    next(frames), next(frames)
    cancel.set()
    rest = list(frames)
    assert rest[-1].done and "(stopped)" in rest[-1].status


def test_live_tab_module_speaks_of_phases_it_knows():
    assert set(live_tab.PHASE_VERBS) == {"replay", "generate", "fidelity"}


def _plotted(figure) -> dict | None:
    """What a figure draws (a copy's JSON may order its keys differently)."""
    return None if figure is None else json.loads(figure.to_json())


@pytest.mark.slow  # four playbacks drawing every chart: 11 s
def test_playbacks_of_one_recording_share_their_charts_each_with_its_own_copy(recording, monkeypatch):
    """Thirty students playing one preset build each chart once (at fixed places along the recording), and a
    chart shown at a place is the one of the run as it stood there."""
    shared = SharedBuilds(kept=64)
    monkeypatch.setattr(shared_charts, "PLAYBACK_CHARTS", shared)
    runs = [
        list(
            playback_frames(recording, math.inf, threading.Event(), TokenChannel(f"t{i}"), None, *[FramePacer(0.0)] * 2)
        )
        for i in range(3)
    ]
    steps = len(recording.timelines["live"])
    places = {chart_position(steps, position) for position in range(steps)}
    assert shared.builds == len(places)  # once each, not once per playback
    finals = [frames[-1].figure for frames in runs]
    assert finals[0] is not finals[1] and finals[0].to_json() == finals[1].to_json()
    playback, draw = Playback(recording, "live", math.inf), partial(live_tab.charts, projection=None, device_stats={})
    for position, _ in enumerate(playback):
        if position in places:
            shown = shared_charts.playback_charts(playback, False, partial(draw, show_device=False), None, False)
            alone = draw(playback, show_device=False)
            assert [_plotted(f) for f in shown] == [_plotted(f) for f in alone]
    compared = list(
        compare_playback(
            recording, math.inf, threading.Event(), [TokenChannel("c0"), TokenChannel("c1")], FramePacer(0.0)
        )
    )
    assert shared.builds == len(places) + 1  # and Compare's, at its end (its own pacer)
    end = Playback(recording, "compare", math.inf).at(len(recording.timelines["compare"]) - 1)
    assert _plotted(compared[-1].figure) == _plotted(compare_charts(end)[0])
