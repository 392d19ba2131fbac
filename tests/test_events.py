"""RunRecord round-trips through JSON + NPZ and refuses what is not a recording."""

from __future__ import annotations

import json

import numpy as np
import pytest

from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.core.events import RecordingError, RunRecord
from thinkviz.policies import make_policy
from tiny_models import tiny_model


@pytest.fixture(scope="module")
def record():
    run = Run(
        tiny_model("llama"),
        make_policy("h2o", budget=12, recent=2),
        list(range(100, 120)),
        DecodeSettings(max_new_tokens=10, stop_at_eos=False),
    )
    list(run.generate())
    return run.record


def test_round_trip_keeps_everything(record, tmp_path):
    record.save(tmp_path / "run")
    loaded = RunRecord.load(tmp_path / "run.json")
    assert loaded.meta == json.loads(json.dumps(record.meta))
    assert loaded.token_ids == record.token_ids
    assert loaded.texts == record.texts
    assert [e.evicted for e in loaded.events] == [e.evicted for e in record.events]
    for a, b in zip(loaded.events, record.events, strict=True):
        np.testing.assert_array_equal(a.keep_fraction, b.keep_fraction)
        np.testing.assert_array_equal(a.scores, b.scores)
        assert a.kv_bytes == b.kv_bytes
    assert set(loaded.snapshots) == set(record.snapshots)
    for step, mask in record.snapshots.items():
        np.testing.assert_array_equal(loaded.snapshots[step], mask)


def test_truncated_npz_is_refused(record, tmp_path):
    record.save(tmp_path / "run")
    npz = tmp_path / "run.npz"
    npz.write_bytes(npz.read_bytes()[:100])
    with pytest.raises(RecordingError, match="NPZ"):
        RunRecord.load(tmp_path / "run")


def test_other_version_and_foreign_json_are_refused(record, tmp_path):
    json_path, _ = record.save(tmp_path / "run")
    doc = json.loads(json_path.read_text())
    doc["version"] = 99
    json_path.write_text(json.dumps(doc))
    with pytest.raises(RecordingError, match="version 99"):
        RunRecord.load(json_path)
    json_path.write_text('{"hello": 1}')
    with pytest.raises(RecordingError, match="not a ThinkViz recording"):
        RunRecord.load(json_path)
    json_path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(RecordingError):
        RunRecord.load(json_path)


def test_pickled_npz_is_never_unpickled(record, tmp_path):
    json_path, npz_path = record.save(tmp_path / "run")
    np.savez(npz_path, scores_0=np.array([object()], dtype=object))
    with pytest.raises(RecordingError):
        RunRecord.load(json_path)


def test_prompt_labels_round_trip_and_older_recordings_load_without_them(record, tmp_path):
    labelled = RunRecord(
        meta=record.meta, prompt_ids=[1, 2], prompt_texts=["<s>", "Hi"], prompt_labels=["template", "user"]
    )
    json_path, _ = labelled.save(tmp_path / "labelled")
    assert RunRecord.load(json_path).prompt_labels == ["template", "user"]
    doc = json.loads(json_path.read_text())
    del doc["prompt_labels"]  # a recording made before prompt labels were stored
    json_path.write_text(json.dumps(doc))
    assert RunRecord.load(json_path).prompt_labels == []
    doc["prompt_labels"] = [1, 2]
    json_path.write_text(json.dumps(doc))
    with pytest.raises(RecordingError, match="prompt_labels must be a list of str"):
        RunRecord.load(json_path)


def test_kept_counts_and_logical_bytes_round_trip_and_bad_counts_are_refused(record, tmp_path):
    layers, heads = record.meta["geometry"]["layers"], record.meta["geometry"]["kv_heads"]
    for i, event in enumerate(record.events):
        event.kept = np.arange(layers * heads).reshape(layers, heads) + i
        event.logical_kv_bytes = event.kv_bytes - i
    record.save(tmp_path / "run")
    loaded = RunRecord.load(tmp_path / "run")
    for a, b in zip(loaded.events, record.events, strict=True):
        np.testing.assert_array_equal(a.kept_counts(layers, heads), b.kept)
        assert a.logical_kv_bytes == b.logical_kv_bytes
    record.events[0].kept = np.zeros((layers + 1, heads), dtype=np.int64)  # not the recorded geometry
    record.save(tmp_path / "bad")
    with pytest.raises(RecordingError, match="kept counts must be"):
        RunRecord.load(tmp_path / "bad")
