"""The committed preset recordings (presets/recordings/<preset>.zip): each one loads without a model,
matches its preset as the preset is now (policy, knobs, columns, chat, trace, decode settings, model,
formats) and plays through the Live frames to the view Explore shows for the recorded run.

``python -m thinkviz presets check`` says which presets have none yet or a stale one;
``python -m thinkviz presets record --stale`` remakes those.
"""

from __future__ import annotations

import math
import threading

import pytest

from thinkviz.presets import list_presets
from thinkviz.recordings import RECORDINGS_DIR
from thinkviz.ui import explore
from thinkviz.ui.compare import playback_frames as compare_playback
from thinkviz.ui.demo import load_preset_recording, preset_request
from thinkviz.ui.live import playback_frames
from thinkviz.ui.stream import TokenChannel
from thinkviz.ui.throttle import FramePacer
from thinkviz.viz.tokens import render_tokens

COMMITTED = sorted(path.stem for path in RECORDINGS_DIR.glob("*.zip"))


def test_every_committed_recording_belongs_to_a_shipped_preset():
    assert set(COMMITTED) <= set(list_presets())


@pytest.mark.parametrize("name", COMMITTED)
def test_a_committed_recording_matches_its_preset_and_plays_to_the_view_explore_shows(name):
    recording = load_preset_recording(name)  # refuses a stale one, naming what changed
    request = preset_request(name)
    live = recording.records[recording.live]
    assert live.meta["policy"] == request.live.policy.name
    assert len(recording.labels) == len(request.columns)
    frames = list(playback_frames(recording, math.inf, threading.Event(), TokenChannel("t"), None, FramePacer(0.0)))
    final = frames[-1]
    assert final.done and "no model needed" in final.status
    shown = explore.explore_view(live, len(live.events) - 1, explore.AVERAGE, explore.AVERAGE, "combined")
    assert render_tokens(final.view, "combined") == shown.tokens_html
    channels = [TokenChannel(f"c{i}") for i in range(6)]
    compared = list(compare_playback(recording, math.inf, threading.Event(), channels, FramePacer(0.0)))[-1]
    assert compared.done and list(compared.records) == recording.labels
