"""Bad input on the UI's paths (the functions the Gradio handlers call), refused with a reason.

What the shared suites already cover is not repeated here: empty questions, bad control
values and unknown policies (test_ui_parts, test_ui_frames), preset YAML and trace files
(test_presets, test_replay), recordings on disk (test_events).  This file adds the prompt
longer than the context, preset names that are paths, hostile recording uploads and
recordings whose fields would reach captions as markup.
"""

from __future__ import annotations

import copy
import json
import threading
import zipfile
from pathlib import Path

import gradio as gr
import numpy as np
import pytest

from thinkviz import export
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.core.events import RecordingError
from thinkviz.policies import make_policy
from thinkviz.export import export_recording, import_recording, record_stem
from thinkviz.ui import explore_views, inputs
from thinkviz.ui.fields import numbers_only
from thinkviz.ui.live_run import live_frames
from thinkviz.measure.requests import RunInput, RunInputError
from thinkviz.ui.stream import TokenChannel
from tiny_models import tiny_model


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def record(tiny):
    run = Run(
        tiny,
        make_policy("h2o", budget=12, recent=2),
        list(range(100, 120)),
        DecodeSettings(max_new_tokens=6, stop_at_eos=False),
    )
    list(run.generate())
    return run.record


def test_a_prompt_longer_than_the_context_is_refused_before_it_runs(tiny):
    words = tiny.geometry.max_context + 10  # at least one token per word
    request = RunInput(system=None, question="go " * words)
    frames = live_frames(
        tiny,
        make_policy("window", budget=64),
        request,
        DecodeSettings(max_new_tokens=4),
        threading.Event(),
        TokenChannel("t"),
    )
    with pytest.raises(RunInputError, match=f"the model's context is {tiny.geometry.max_context}"):
        next(frames)


@pytest.mark.parametrize("name", ["../../etc/hostname.yaml", "/etc/os-release.yaml", "presets/quick.yaml"])
def test_preset_choices_are_names_never_paths(name, tmp_path):
    with pytest.raises(RunInputError, match="unknown preset"):
        inputs.choose_preset(name)


def test_a_preset_file_elsewhere_is_not_read_through_the_ui(tmp_path):
    outside = tmp_path / "evil.yaml"
    outside.write_text("title: t\nnotice: n\npolicy: h2o\nquestion: q\n", encoding="utf-8")
    with pytest.raises(RunInputError, match="unknown preset"):
        inputs.choose_preset(str(outside))


def _zip(path: Path, members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _members(record, tmp_path) -> dict[str, bytes]:
    archive = export_recording(record, tmp_path / "export")
    with zipfile.ZipFile(archive) as zf:
        return {Path(n).suffix: zf.read(n) for n in zf.namelist()}


def test_a_truncated_zip_upload_is_refused(record, tmp_path):
    archive = export_recording(record, tmp_path)
    cut = tmp_path / "cut.zip"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(RecordingError):
        import_recording([cut])


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_a_corrupted_compressed_member_is_refused(record, tmp_path, compression):
    parts = _members(record, tmp_path)
    archive = _zip(tmp_path / "packed.zip", {"r.json": parts[".json"], "r.npz": parts[".npz"]}, compression)
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo("r.json")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)  # the compressed bytes
    for i in range(start + 4, start + 40):
        data[i] ^= 0xFF
    archive.write_bytes(bytes(data))
    with pytest.raises(RecordingError):
        import_recording([archive])


def test_zip_members_over_the_size_limit_are_refused_before_reading(record, tmp_path, monkeypatch):
    parts = _members(record, tmp_path)
    monkeypatch.setattr(export, "MAX_RECORDING_BYTES", len(parts[".json"]) - 1)
    archive = _zip(tmp_path / "big.zip", {"r.json": parts[".json"], "r.npz": parts[".npz"]})
    with pytest.raises(RecordingError, match="larger than"):
        import_recording([archive])


def test_member_names_that_climb_out_are_written_inside_the_import_folder(record, tmp_path):
    parts = _members(record, tmp_path)
    target = tmp_path / "escaped"
    archive = _zip(tmp_path / "climb.zip", {"../../escaped.json": parts[".json"], "../../escaped.npz": parts[".npz"]})
    loaded = import_recording([archive])
    assert loaded.texts == record.texts
    assert not target.with_suffix(".json").exists() and not Path("/tmp/escaped.json").exists()


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"\xff\xfe\x00not utf-8 at all", "not a ThinkViz recording"),
        (b"[1, 2, 3]", "not a ThinkViz recording"),
    ],
)
def test_uploads_that_are_not_our_json_are_refused(record, tmp_path, payload, reason):
    parts = _members(record, tmp_path)
    archive = _zip(tmp_path / "other.zip", {"r.json": payload, "r.npz": parts[".npz"]})
    with pytest.raises(RecordingError, match=reason):
        import_recording([archive])


def test_another_format_version_is_refused_through_the_upload(record, tmp_path):
    parts = _members(record, tmp_path)
    doc = json.loads(parts[".json"])
    doc["version"] = 99
    archive = _zip(tmp_path / "v99.zip", {"r.json": json.dumps(doc).encode(), "r.npz": parts[".npz"]})
    with pytest.raises(RecordingError, match="version 99 is not supported"):
        import_recording([archive])


@pytest.mark.parametrize(
    "field, value",
    [
        ("step", "<img src=x onerror=alert(1)>"),
        ("kv_tokens", "<script>alert(1)</script>"),
        ("texts", [{"html": "<b>"}]),
    ],
)
def test_recording_fields_of_the_wrong_type_are_refused(record, tmp_path, field, value):
    parts = _members(record, tmp_path)
    doc = json.loads(parts[".json"])
    doc["events"][0][field] = value
    archive = _zip(tmp_path / "typed.zip", {"r.json": json.dumps(doc).encode(), "r.npz": parts[".npz"]})
    with pytest.raises(RecordingError, match=f"{field} must be"):
        import_recording([archive])


def test_recorded_text_reaches_the_explore_view_as_text(record, tmp_path):
    parts = _members(record, tmp_path)
    doc = json.loads(parts[".json"])
    doc["prompt_texts"][0] = "<script>alert(1)</script>"
    archive = _zip(tmp_path / "text.zip", {"r.json": json.dumps(doc).encode(), "r.npz": parts[".npz"]})
    view = explore_views.explore_view(
        import_recording([archive]), 0, explore_views.AVERAGE, explore_views.AVERAGE, "combined"
    )
    assert "<script>" not in view.tokens_html and "&lt;script&gt;" in view.tokens_html
    assert "<" not in view.caption


def test_export_names_never_carry_a_path_from_the_recording(record, tmp_path):
    hostile = type(record)(**{**record.__dict__, "meta": {**record.meta, "policy": "../../etc/passwd", "budget": "/x"}})
    stem = record_stem(hostile)
    assert "/" not in stem
    archive = export_recording(hostile, tmp_path / "out")
    assert archive.parent == tmp_path / "out" and archive.exists()


@pytest.mark.parametrize("payload", ["lots", None, True, float("nan"), float("inf"), [1], "<b>8</b>"])
def test_sliders_refuse_what_is_not_a_number_naming_the_control(payload):
    budget = copy.deepcopy(numbers_only(gr.Slider(8, 64, value=16, label="Budget")))  # as Gradio copies per session
    with pytest.raises(gr.Error, match="Budget must be a number") as info:
        budget.preprocess(payload)
    assert "<b>" not in info.value.message
    assert budget.preprocess.__self__ is budget  # the copy checks its own range
    assert budget.preprocess(24) == 24
    with pytest.raises(gr.Error, match="greater than maximum"):
        budget.preprocess(65)


@pytest.mark.parametrize(
    "content, reason",
    [
        (None, "unknown preset 'no_such_preset'"),
        (b"title: [unclosed\n", "malformed YAML"),
        ("title: caf\u00e9\n".encode("latin-1"), "not UTF-8"),
    ],
)
def test_the_cli_refuses_unknown_and_broken_presets_in_one_line(tmp_path, content, reason):
    from test_sweep_cli import _one_line_error, _refused

    spec = "no_such_preset"
    if content is not None:
        spec = str(tmp_path / "broken.yaml")
        Path(spec).write_bytes(content)
    _one_line_error(_refused("--trace", spec, "--policies", "h2o", "--budgets", "128"), reason)


def test_a_json_and_npz_pair_over_the_size_limit_is_refused(record, tmp_path, monkeypatch):
    from thinkviz.core import events

    json_path, npz_path = record.save(tmp_path / "pair")
    monkeypatch.setattr(events, "MAX_RECORDING_BYTES", min(json_path.stat().st_size, npz_path.stat().st_size) - 1)
    with pytest.raises(RecordingError, match="larger than"):
        import_recording([json_path, npz_path])


def _short_scores(doc, arrays):
    arrays["scores_0"] = arrays["scores_0"][:3]


def _keep_of_two_dims(doc, arrays):
    arrays["keep_1"] = np.zeros((2, 2))


def _meta_not_a_mapping(doc, arrays):
    doc["meta"] = "nope"


def _geometry_not_numbers(doc, arrays):
    doc["meta"]["geometry"] = {"layers": "x", "kv_heads": -1}


def _no_events(doc, arrays):
    doc["events"] = []


def _segment_bounds_not_numbers(doc, arrays):
    doc["segments"] = [{"kind": "think", "start": "a"}]


def _prompt_texts_not_text(doc, arrays):
    doc["prompt_texts"] = [1, 2]


@pytest.mark.parametrize(
    "damage",
    [
        _short_scores,
        _keep_of_two_dims,
        _meta_not_a_mapping,
        _geometry_not_numbers,
        _no_events,
        _segment_bounds_not_numbers,
        _prompt_texts_not_text,
    ],
)
def test_inconsistent_recordings_end_in_a_message_on_upload_or_in_explore(record, tmp_path, damage):
    """Whatever a recording claims, opening and exploring it raises ValueError (a RecordingError or a
    renderer's refusal): the UI shows those as messages."""
    json_path, npz_path = record.save(tmp_path / "good")
    doc = json.loads(json_path.read_text(encoding="utf-8"))
    with np.load(npz_path) as npz:
        arrays = dict(npz)
    damage(doc, arrays)
    (tmp_path / "bad.json").write_text(json.dumps(doc), encoding="utf-8")
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError):
        loaded = import_recording([tmp_path / "bad.json", tmp_path / "bad.npz"])
        for step in (0, len(loaded.events) - 1):
            explore_views.explore_view(loaded, step, explore_views.AVERAGE, explore_views.AVERAGE, "combined")
            explore_views.explore_view(loaded, step, "0", "0", "evicted")
