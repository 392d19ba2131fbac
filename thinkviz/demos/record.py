"""Preset demos that start at once: record what the Live and Compare tabs run for a preset, and check
that a recording still matches its preset.

:func:`preset_request` builds, from a preset alone, the request the tabs build from the controls
a preset fills in (the chat, decode settings, Live's policy, Compare's columns);
:func:`preset_signature` is what a recording must have been made for; :func:`record_preset`
drives the same :class:`~thinkviz.measure.comparison.Comparison` the tabs drive (Live's run with its
full-cache reference, then Compare's columns) on the real model and keeps what every step showed.
:func:`load_preset_recording` reads a committed recording and refuses a stale one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from collections.abc import Callable

import numpy as np

from ..measure.answer_attention import attach_answer_attention
from ..measure.comparison import Column, Comparison, column_labels, live_column, preset_columns
from ..core.engine import DecodeSettings
from ..core.events import FORMAT_VERSION, RecordingError, RunRecord
from ..models.loading import EMBEDDED, LoadedModel, display_name
from .recordings import (
    BUNDLE_VERSION,
    LIVE_KEY,
    REFERENCE_KEY,
    Recording,
    Step,
    check,
    clip_segments,
    digest,
    load,
    machine,
    recording_path,
)
from ..measure.requests import RunInput, RunInputError, decode_settings, prepare, run_input
from .shared import SharedBuilds
from .presets import Preset, PresetError, list_presets, load_preset

RECORDING_MODEL = (EMBEDDED, "4bit")  # what every committed recording is made with (the app's default)
CACHED_RECORDINGS = 4  # recordings kept decoded in memory (a few MB each)
_RECORDINGS: SharedBuilds[Recording] = SharedBuilds(CACHED_RECORDINGS)  # by (name, mtime, size)
Progress = Callable[[str, int, int], None]  # (phase, tokens done, tokens in the phase)


@dataclass(frozen=True)
class PresetRequest:
    """What the tabs run for a preset once it is picked."""

    name: str
    mode: str
    run_input: RunInput
    settings: DecodeSettings
    live: Column
    columns: list[Column]


def named_preset(name: str) -> Preset:
    """Preset ``name`` (a name from :func:`~thinkviz.demos.presets.list_presets`, never a path);
    :class:`~thinkviz.measure.requests.RunInputError` with the preset's reason."""
    if name not in list_presets():
        raise RunInputError(f"unknown preset {name!r}; choose one from the list")
    try:
        return load_preset(name)
    except PresetError as exc:
        raise RunInputError(str(exc)) from None


def preset_request(name: str) -> PresetRequest:
    """The request the Live and Compare tabs make for preset ``name`` (:class:`~thinkviz.measure.requests.RunInputError`
    for an unknown or broken preset)."""
    preset = named_preset(name)
    request = run_input(preset.mode, preset.system_prompt, preset.question, preset.trace or "")
    settings = decode_settings(preset.max_new_tokens, 0.0, True)
    return PresetRequest(name, preset.mode, request, settings, live_column(preset), preset_columns(preset))


def _column_key(column: Column) -> list:
    """A column's policy, knobs and KV format, and the files its policy reads (only when it reads
    some, so that the keys of the other policies' recordings stay as they were).  A knob at its
    :attr:`~thinkviz.policies.base.Param.before` value is left out: the rule ran so before it existed."""
    policy = column.policy
    knobs = {p.name: policy.config[p.name] for p in policy.all_params() if policy.config[p.name] != p.before}
    key = [policy.name, knobs, column.kv_quant.describe()]
    files = policy.file_fingerprints(display_name(RECORDING_MODEL[0]))
    return key + [files] if files else key


def preset_signature(name: str) -> dict[str, Any]:
    """What preset ``name``'s recording must have been made for (:func:`request_signature`)."""
    return request_signature(preset_request(name))


def request_signature(request: PresetRequest) -> dict[str, Any]:
    """What a recording of ``request`` depends on: its runs (policy, knobs, KV formats, the columns),
    its chat and trace (fingerprints), the decode settings, the model and the formats."""
    run_input = request.run_input
    signature = {
        "mode": request.mode,
        "live": _column_key(request.live),
        "columns": [[label, *_column_key(c)] for label, c in zip(column_labels(request.columns), request.columns)],
        "system": digest(run_input.system),
        "question": digest(run_input.question),
        "trace": digest(run_input.trace),
        "settings": request.settings.__dict__,
        "model": list(RECORDING_MODEL),
        "formats": [BUNDLE_VERSION, FORMAT_VERSION],
    }
    return json.loads(json.dumps(signature))  # as it reads back from a file (tuples become lists)


def load_preset_recording(name: str) -> Recording:
    """Preset ``name``'s committed recording, checked against the preset as it is now;
    :class:`~thinkviz.core.events.RecordingError` if there is none or it is stale.  Read once per
    version of the file (a recording is never changed in place by a player): a room of clients asking
    for the same recording at once waits for one decoding of it, not one each (a decoding holds the
    interpreter for a third of a second: thirty of them put the last client's first frame 10 s out)."""
    path = recording_path(name)
    if not path.is_file():
        raise RecordingError(f"preset {name!r} has no recording yet (python -m thinkviz presets record {name})")
    stat = path.stat()
    recording = _RECORDINGS.get((name, stat.st_mtime_ns, stat.st_size), lambda: load(path))
    check(recording, preset_signature(name))
    return recording


def recording_problem(name: str) -> str | None:
    """Why preset ``name``'s recording cannot be played (``None``: it can)."""
    try:
        load_preset_recording(name)
    except (RecordingError, RunInputError) as exc:
        return str(exc)
    return None


class _Tape:
    """Keeps what a comparison showed after every step: the timeline and each record's segments."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock, self.start = clock, clock()
        self.steps: list[Step] = []
        self.segments: dict[int, dict[int, list[dict]]] = {}

    def keep(self, comparison: Comparison, records: list[RunRecord], keys: dict[int | None, str]) -> None:
        counts = tuple(len(record.events) for record in records)
        for index, record in enumerate(records):
            self.segments.setdefault(index, {})[counts[index]] = [dict(s) for s in record.segments]
        shown = {keys[k]: len(f.positions) for k, f in comparison.fidelity.items() if k in keys}
        self.steps.append(
            Step(self.clock() - self.start, comparison.phase, comparison.done, comparison.total, counts, shown)
        )


def _drive(
    comparison: Comparison,
    tape: _Tape,
    records: Callable[[], list[RunRecord]],
    keys: dict[int | None, str],
    progress: Progress | None,
) -> None:
    for _ in comparison:
        tape.keep(comparison, records(), keys)
        if progress is not None:
            progress(comparison.phase, comparison.done, comparison.total)


def _same_run(a: RunRecord, b: RunRecord) -> bool:
    """The same events, arrays and snapshots (timings aside; scores within float32 rounding, since a
    run batched with other rows computes within ~1e-6 of itself alone): one record can stand for both."""
    if len(a.events) != len(b.events) or a.meta["params"] != b.meta["params"]:
        return False
    if a.snapshots.keys() != b.snapshots.keys():
        return False
    for x, y in zip(a.events, b.events):
        if x.token_ids != y.token_ids or x.evicted != y.evicted or x.kv_bytes != y.kv_bytes:
            return False
        if not np.allclose(x.scores, y.scores, rtol=1e-4, atol=1e-6, equal_nan=True):
            return False
        if not np.array_equal(x.keep_fraction, y.keep_fraction):
            return False
    return all(np.array_equal(a.snapshots[s], b.snapshots[s]) for s in a.snapshots)


def record_preset(
    loaded: LoadedModel, name: str, progress: Progress | None = None, clock: Callable[[], float] = time.monotonic
) -> Recording:
    """Run preset ``name`` as the Live tab (its policy, fidelity measured) and the Compare tab (its
    columns) would, on ``loaded``, and keep every step."""
    return record(loaded, preset_request(name), progress, clock)


def record(
    loaded: LoadedModel,
    request: PresetRequest,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Recording:
    """:func:`record_preset` for any request."""
    name = request.name
    prompt, trace_ids = prepare(loaded, request.run_input)
    compare = Comparison(loaded, request.columns, prompt, trace_ids, request.settings, measure=True)
    columns = len(request.columns)
    keys = {**{i: str(i) for i in range(columns)}, None: REFERENCE_KEY}
    compare_tape = _Tape(clock)

    apart = not compare.replay and not compare.references  # a generation's own full-cache run: for divergence

    def compare_records() -> list[RunRecord]:
        return [run.record for run in compare.runs] + ([compare.reference.record] if apart else [])

    _drive(compare, compare_tape, compare_records, keys, progress)
    live = Comparison(loaded, [request.live], prompt, trace_ids, request.settings, measure=True, reference_run=False)
    live_tape = _Tape(clock)
    records = compare_records()
    _drive(live, live_tape, lambda: [live.runs[0].record] if live.runs else [], {0: LIVE_KEY}, progress)
    live_record = live.runs[0].record
    same = next((i for i in range(columns) if _same_run(records[i], live_record)), None)
    if same is None:
        same = len(records)
        records.append(live_record)
    if request.live.policy.predicts_importance:  # as Live does when a run ends: what the answer used
        attach_answer_attention(loaded, records[same])
    reference = compare.references[0] if compare.references else columns if apart else None
    width = len(records)
    live_steps = [
        Step(
            s.seconds,
            s.phase,
            s.done,
            s.total,
            tuple(s.events[0] if i == same else 0 for i in range(width)),
            s.fidelity,
        )
        for s in live_tape.steps
    ]
    compare_steps = [
        Step(s.seconds, s.phase, s.done, s.total, s.events + (0,) * (width - len(s.events)), s.fidelity)
        for s in compare_tape.steps
    ]
    segments = {**compare_tape.segments}
    if same >= columns:
        segments[same] = live_tape.segments.get(0, {})
    fidelity = {keys[k]: f for k, f in compare.fidelity.items() if k in keys}
    fidelity[LIVE_KEY] = live.fidelity[0]
    recorded = {
        "model": loaded.name,
        "quantization": loaded.quantization,
        "backend": loaded.backend,
        "device": str(loaded.device),
        "machine": machine(),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "seconds": {"live": live_tape.steps[-1].seconds, "compare": compare_tape.steps[-1].seconds},
    }
    return Recording(
        name,
        request_signature(request),
        request.mode,
        column_labels(request.columns),
        records,
        same,
        reference,
        fidelity,
        {"live": live_steps, "compare": compare_steps},
        _overrides(records, segments),
        recorded,
    )


def _overrides(records: list[RunRecord], seen: dict[int, dict[int, list[dict]]]) -> dict[int, dict[int, list[dict]]]:
    """The recorded segments only where they differ from the final ones cut at that step."""
    out: dict[int, dict[int, list[dict]]] = {}
    for index, by_count in seen.items():
        record = records[index]
        for count, spans in by_count.items():
            known = len(record.prompt_ids) + sum(len(e.token_ids) for e in record.events[:count])
            if spans != clip_segments(record.segments, known):
                out.setdefault(index, {})[count] = spans
    return out
