"""The committed preset recordings (presets/recordings/<preset>.zip): each one loads without a model,
matches its preset as the preset is now (policy, knobs, columns, chat, trace, decode settings, model,
formats) and plays through the Live frames to the view Explore shows for the recorded run.

``python -m thinkviz presets check`` says which presets have none yet or a stale one;
``python -m thinkviz presets record --stale`` remakes those.
"""

from __future__ import annotations

import itertools
import math
import shutil
import threading

import pytest

from thinkviz.models.loading import EMBEDDED, display_name
from thinkviz.policies.dynts import DynTS
from thinkviz.demos.presets import list_presets
from thinkviz.demos.recordings import RECORDINGS_DIR
from thinkviz.ui import explore_views
from thinkviz.ui.compare_run import playback_frames as compare_playback
from thinkviz.demos.record import load_preset_recording, preset_request, recording_problem
from thinkviz.ui.live_run import playback_frames
from thinkviz.ui.stream import TokenChannel
from thinkviz.ui.throttle import FramePacer
from thinkviz.viz.tokens import render_tokens

COMMITTED = sorted(path.stem for path in RECORDINGS_DIR.glob("*.zip"))
FRAMES = 8  # frames drawn along a play-through, besides the first and the last


def sampled(steps: int) -> FramePacer:
    """A pacer due about ``FRAMES`` times over ``steps`` steps (its clock ticks once a call): the play-through
    draws frames from the whole run, without drawing all of them (every frame: ~100 s over the recordings)."""
    return FramePacer(max(1, steps // FRAMES), clock=itertools.count().__next__)


def test_every_committed_recording_belongs_to_a_shipped_preset():
    assert set(COMMITTED) <= set(list_presets())


@pytest.mark.parametrize("name", COMMITTED)
@pytest.mark.slow
def test_a_committed_recording_matches_its_preset_and_plays_to_the_view_explore_shows(name):
    recording = load_preset_recording(name)  # refuses a stale one, naming what changed
    request = preset_request(name)
    live = recording.records[recording.live]
    assert live.meta["policy"] == request.live.policy.name
    assert len(recording.labels) == len(request.columns)
    pacer = sampled(len(live.events))
    frames = list(playback_frames(recording, math.inf, threading.Event(), TokenChannel("t"), None, pacer))
    assert len(frames) >= min(FRAMES, len(live.events)) // 2  # frames along the way, not only the first and last
    final = frames[-1]
    assert final.done and "no model needed" in final.status
    shown = explore_views.explore_view(
        live, len(live.events) - 1, explore_views.AVERAGE, explore_views.AVERAGE, "combined"
    )
    assert render_tokens(final.view, "combined") == shown.tokens_html
    channels = [TokenChannel(f"c{i}") for i in range(6)]
    compared = list(compare_playback(recording, math.inf, threading.Event(), channels, sampled(len(live.events))))[-1]
    assert compared.done and list(compared.records) == recording.labels


def test_a_recording_of_dynts_goes_stale_when_the_predictor_files_it_read_change(tmp_path, monkeypatch):
    shipped = DynTS.files_read(display_name(EMBEDDED))  # the predictor and its evaluation table
    for path in shipped:
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.setattr(DynTS, "predictor_folder", tmp_path)
    assert recording_problem("dynts_math") is None  # the same bytes, wherever they lie
    table = tmp_path / shipped[1].name
    table.write_text(table.read_text(encoding="utf-8") + "\n", "utf-8")
    problem = recording_problem("dynts_math")
    assert "is stale (" in problem and "live" in problem
    assert recording_problem("math_h2o_vs_window") is None  # a policy that reads no files: its key is as before
