"""Preset recordings: the codec round trip, stale recordings refused, playback at a chosen speed.

The committed recordings of every shipped preset are checked in tests/test_preset_recordings.py.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import replace

import numpy as np
import pytest

from thinkviz.measure.comparison import Column
from thinkviz.core.events import RecordingError
from thinkviz.demos.playback import Playback
from thinkviz.policies import make_policy
from thinkviz.demos.recordings import check, load, save, score_codes, score_values
from thinkviz.demos.record import PresetRequest, record, request_signature
from thinkviz.measure.requests import decode_settings
from thinkviz.measure.requests import RunInput
from tiny_models import tiny_model

TRACE = (
    "<think>\nFirst add 1 and 2 to get 3.\n\nThen add 3 to get 6.\n\nCheck: 1 + 2 + 3 = 6.\n</think>\n\nThe sum is 6.\n"
) * 3


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama")


def _request(mode: str = "replay", recent: int = 8) -> PresetRequest:
    knobs = {"budget": 48, "interval": 8}
    columns = [
        Column(make_policy("full", interval=8)),
        Column(make_policy("window", **knobs)),
        Column(make_policy("h2o", recent=recent, **knobs)),
    ]
    run_input = RunInput("Think step by step.", "Sum the list 1, 2, 3.", TRACE if mode == "replay" else None)
    return PresetRequest("tiny_demo", mode, run_input, decode_settings(40, 0.0, False), columns[2], columns)


@pytest.fixture(scope="module", params=["replay", "generate"])
def recorded(request, tiny, tmp_path_factory):
    recording = record(tiny, _request(request.param))
    path = save(recording, tmp_path_factory.mktemp("rec") / "tiny_demo.zip")
    return recording, path


def test_scores_keep_the_three_digits_the_tooltips_show():
    scores = np.array(
        [0.0123456, 1.0, 999.5, 0.000999999, -0.25, 0.0, np.nan, np.inf, 3.4e38, 1.2e-40], dtype=np.float32
    )
    back = score_values(score_codes(scores))
    assert [f"{x:.3g}" for x in back] == [f"{x:.3g}" for x in scores]
    assert np.isnan(back[6]) and back[7] == np.inf


def test_a_recording_reads_back_as_it_was_recorded(recorded):
    recording, path = recorded
    back = load(path)
    assert back.labels == ["full", "window", "h2o"] and back.live == 2
    assert with_zip_members_compressed(path)
    for original, loaded in zip(recording.records, back.records):
        assert [e.token_ids for e in loaded.events] == [e.token_ids for e in original.events]
        assert loaded.meta == original.meta and loaded.segments == original.segments
        for a, b in zip(original.events, loaded.events):
            assert np.array_equal(a.keep_fraction, b.keep_fraction)  # exact
            assert [f"{x:.3g}" for x in a.scores] == [f"{x:.3g}" for x in b.scores]
            assert a.info == b.info  # per-token fidelity of a lockstep replay included
        assert loaded.snapshots.keys() == original.snapshots.keys()
        assert all(np.array_equal(original.snapshots[s], loaded.snapshots[s]) for s in original.snapshots)
    for key, fidelity in recording.fidelity.items():
        assert np.array_equal(back.fidelity[key].kl, fidelity.kl)
    assert back.timelines["compare"][-1].events == recording.timelines["compare"][-1].events


def with_zip_members_compressed(path) -> bool:
    with zipfile.ZipFile(path) as zf:
        return all(info.compress_type == zipfile.ZIP_LZMA for info in zf.infolist())


def test_a_stale_recording_names_what_changed(recorded):
    recording, path = recorded
    check(load(path), request_signature(_request(recording.mode)))
    with pytest.raises(RecordingError, match=r"stale \(columns, live changed.*presets record tiny_demo"):
        check(load(path), request_signature(_request(recording.mode, recent=16)))
    other_format = replace(load(path), signature={**recording.signature, "formats": [0, 0]})
    with pytest.raises(RecordingError, match="formats changed"):
        check(other_format, recording.signature)


def test_playback_follows_the_recorded_pace_at_the_chosen_speed(recorded):
    recording, path = recorded

    class FakeTime:
        now = 0.0

        def clock(self):
            return self.now

        def sleep(self, seconds):
            self.now += seconds

    fake, back = FakeTime(), load(path)
    playback = Playback(back, "compare", speed=4.0, clock=fake.clock, sleep=fake.sleep)
    seen = [len(run.record.events) for _ in playback for run in playback.runs[:1]]
    assert fake.now == pytest.approx(recording.timelines["compare"][-1].seconds / 4)
    assert seen == sorted(seen) and seen[-1] == len(recording.records[0].events)
    assert [run.record.summary for run in playback.runs] == [r.summary for r in back.records[:3]]  # once over


def test_playback_as_fast_as_it_draws_and_stopping(recorded):
    _, path = recorded
    playback = Playback(load(path), "live", speed=math.inf)
    steps = iter(playback)
    next(steps)
    assert playback.runs[0].record.summary == {}  # not over yet
    playback.cancel.set()
    assert list(steps) == [] and playback.stopped


def test_a_damaged_file_is_a_recording_error(tmp_path):
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(RecordingError):
        load(bad)
    with pytest.raises(RecordingError, match="does not exist"):
        load(tmp_path / "missing.zip")


def test_a_recording_of_a_policy_that_predicts_importance_keeps_the_attention_from_the_answer(tiny, tmp_path):
    request = _request()
    live = Column(make_policy("dynts", budget=48, interval=8))
    recording = record(tiny, replace(request, live=live, columns=[request.columns[0], live]))
    measured = recording.records[recording.live].summary["answer_attention"]
    assert any(value is not None for value in measured)  # as a Live run of dynts ends
    loaded = load(save(recording, tmp_path / "dynts.zip"))
    assert loaded.records[loaded.live].summary["answer_attention"] == measured
