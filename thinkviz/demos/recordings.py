"""Preset recordings: what a preset's runs produced on the real engine, stored small, read without a model.

A recording is one zip, ``presets/recordings/<preset>.zip``, of two LZMA-compressed members:

- ``recording.json``: the manifest (format and version, the preset's :func:`signature` at recording
  time, the column labels, which record is Live's, the timeline of the run, who recorded it) and
  every run's recording document, exactly as :meth:`RunRecord.save <thinkviz.core.events.RunRecord.save>`
  writes it (the current recording format);
- ``arrays.npz``: those documents' arrays, re-encoded so that they compress: per run, the scores of
  every step stacked into one matrix and kept to the three significant digits the token view shows
  (its tooltips; the heat, a rank within the frame, is computed from them), the keep fractions as
  the exact counts of (layer, kv-head) slots holding each token, both as differences from the
  previous step, byte plane by byte plane; snapshots and any other array as they are; and the
  per-token fidelity of every column (float32, exact).

Loading decodes the arrays back into each run's ``.json`` + ``.npz`` pair and reads it with
:meth:`RunRecord.load <thinkviz.core.events.RunRecord.load>`, so a recording is always read by the
recording format's own loader, and a change of that format shows up as a stale recording.

Each timeline (the Live tab's run, the Compare tab's) says what was on screen after each step of
the recorded run: the seconds since it started, the phase, the tokens done, how many events every
record had and how many tokens of fidelity every column had measured; ``segments`` keeps the
segmenter's spans after the few steps where they differ from the final spans cut at that step (a
boundary decided later).  A player rebuilds any moment of the run from these.
"""

from __future__ import annotations

import hashlib
import os
import io
import json
import platform
import tempfile
import zipfile
import lzma
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import numpy as np

from ..core.events import FORMAT_VERSION, MAX_RECORDING_BYTES, RecordingError, RunRecord
from ..measure.metrics import TokenFidelity
from ..parser_lock import read_arrays
from .presets import PRESETS_DIR

RECORDINGS_DIR = PRESETS_DIR / "recordings"
BUNDLE_FORMAT = "thinkviz-preset-recording"
BUNDLE_VERSION = 1
MANIFEST, ARRAYS = "recording.json", "arrays.npz"
FIDELITY_FIELDS = ("positions", "nll", "nll_full", "kl", "top1")
REFERENCE_KEY = "reference"  # the fidelity key of the full-cache reference's own row
LIVE_KEY = "live"  # the fidelity key of Live's run, measured on its own
TIMELINES = ("live", "compare")


@dataclass(frozen=True)
class Step:
    """The recorded run after one step: ``seconds`` since it began, its ``phase``, ``done`` of ``total``
    tokens, each record's number of events and each fidelity key's number of measured tokens."""

    seconds: float
    phase: str
    done: int
    total: int
    events: tuple[int, ...]
    fidelity: dict[str, int] = field(default_factory=dict)


@dataclass
class Recording:
    """A preset's recorded runs.  ``records`` holds the columns' runs in column order, then Live's run
    when it is no column, then the full-cache reference when it is stored apart (a generation's, for
    the divergence step); ``live`` and ``reference`` index into it.  ``fidelity`` maps a column
    index (as a string) or :data:`REFERENCE_KEY` to its whole per-token fidelity."""

    preset: str
    signature: dict[str, Any]
    mode: str
    labels: list[str]
    records: list[RunRecord]
    live: int
    reference: int | None
    fidelity: dict[str, TokenFidelity]
    timelines: dict[str, list[Step]]  # "live" and "compare": what each tab showed, step by step
    segments: dict[int, dict[int, list[dict]]] = field(default_factory=dict)  # record -> events shown -> spans
    recorded: dict[str, Any] = field(default_factory=dict)  # model, machine, date, seconds

    def segments_at(self, record: int, events: int) -> list[dict]:
        """Record ``record``'s segments when it had shown ``events`` events."""
        override = self.segments.get(record, {}).get(events)
        if override is not None:
            return override
        run = self.records[record]
        seen = len(run.prompt_ids) + sum(len(e.token_ids) for e in run.events[:events])
        return clip_segments(run.segments, seen)


def recording_path(preset: str) -> Path:
    return RECORDINGS_DIR / f"{preset}.zip"


def digest(text: str | None) -> str | None:
    """A short fingerprint of a text the recording depends on (question, trace …)."""
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def clip_segments(spans: Sequence[dict], seen: int) -> list[dict]:
    """``spans`` as they stood when ``seen`` tokens were known: those begun by then, cut there, and
    still open if they went on."""
    out = []
    for span in spans:
        if span["start"] >= seen:
            continue
        end = min(span["end"], seen)
        out.append({**span, "end": end, "closed": bool(span.get("closed", True)) and span["end"] <= seen})
    return out


def check(recording: Recording, expected: dict[str, Any]) -> None:
    """:class:`RecordingError` naming what changed if ``recording`` was not made for ``expected`` (a
    preset's current :func:`signature`) in the current formats."""
    if recording.signature == expected:
        return
    changed = sorted(
        key for key in set(expected) | set(recording.signature) if expected.get(key) != recording.signature.get(key)
    )
    raise RecordingError(
        f"the recording of preset {recording.preset!r} is stale ({', '.join(changed)} changed since it was made); "
        f"record it again: python -m thinkviz presets record {recording.preset}"
    )


# ---- saving -------------------------------------------------------------------------------------
def save(recording: Recording, path: str | Path) -> Path:
    """Write ``recording`` as one zip (LZMA members) at ``path``."""
    path = Path(path)
    documents, arrays = [], {}
    with tempfile.TemporaryDirectory(prefix="thinkviz-recording-") as folder:
        for i, record in enumerate(recording.records):
            json_path, npz_path = record.save(Path(folder) / f"run{i}")
            document = json.loads(json_path.read_text(encoding="utf-8"))
            arrays.update(_take_event_fidelity(i, document))
            documents.append(document)
            arrays.update(_encode_run(i, read_arrays(npz_path), _slots(record)))
    for key, fidelity in recording.fidelity.items():
        for name in FIDELITY_FIELDS:
            arrays[f"fidelity.{key}.{name}"] = np.asarray(getattr(fidelity, name))
    manifest = {
        "format": BUNDLE_FORMAT,
        "version": BUNDLE_VERSION,
        "record_format": FORMAT_VERSION,
        "preset": recording.preset,
        "signature": recording.signature,
        "mode": recording.mode,
        "labels": recording.labels,
        "live": recording.live,
        "reference": recording.reference,
        "fidelity": sorted(recording.fidelity),
        "timelines": {
            view: [[s.seconds, s.phase, s.done, s.total, list(s.events), s.fidelity] for s in steps]
            for view, steps in recording.timelines.items()
        },
        "segments": {str(r): {str(n): spans for n, spans in by.items()} for r, by in recording.segments.items()},
        "recorded": recording.recorded,
        "runs": documents,
    }
    arrays, manifest["same"] = _deduplicated(arrays)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # uncompressed: the zip's LZMA compresses it as a whole
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_LZMA) as zf:
        zf.writestr(MANIFEST, json.dumps(manifest, ensure_ascii=False, separators=(",", ":")))
        zf.writestr(ARRAYS, buffer.getvalue())
    return path


def machine() -> str:
    """What recorded it, for the manifest: the CPU and the number of cores."""
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def _deduplicated(arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """``arrays`` with each repeated array kept once (Live's fidelity is often a column's, every column
    shares the full cache's NLL, a lockstep replay's per-event fidelity is its column's), and
    ``{name: the name it repeats}``."""
    kept: dict[str, np.ndarray] = {}
    same: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, array in arrays.items():
        key = (array.dtype.str, array.shape, hashlib.sha256(np.ascontiguousarray(array).tobytes()).digest())
        if key in seen:
            same[name] = seen[key]
        else:
            seen[key] = name
            kept[name] = array
    return kept, same


def _slots(record: RunRecord) -> int:
    geometry = record.meta.get("geometry", {})
    return int(geometry.get("layers", 0)) * int(geometry.get("kv_heads", 0))


def _encode_run(i: int, arrays: dict[str, np.ndarray], slots: int) -> dict[str, np.ndarray]:
    steps = sum(1 for name in arrays if name.startswith("scores_"))
    scores = [arrays.pop(f"scores_{j}") for j in range(steps)]
    keeps = [arrays.pop(f"keep_{j}") for j in range(steps)]
    lengths = np.array([len(s) for s in scores], dtype=np.int64)
    width = int(lengths.max(initial=0))
    codes = np.zeros((steps, width), dtype=np.int32)
    counts = np.zeros((steps, width), dtype=np.int32)
    exact = slots > 0
    for j, (score, keep) in enumerate(zip(scores, keeps)):
        codes[j, : len(score)] = score_codes(score)
        count = np.rint(np.asarray(keep, dtype=np.float64) * slots).astype(np.int32) if exact else 0
        if exact and not np.array_equal(_keep_from(count, slots), keep):
            exact = False  # not a count of slots (a format to come): keep the floats as they are
        if exact:
            counts[j, : len(keep)] = count
    out = {f"r{i}.lengths": lengths, f"r{i}.scores": _planes(_steps_diff(codes))}
    if exact:
        out[f"r{i}.keep"] = _planes(_steps_diff(counts))
    else:
        out.update({f"r{i}.raw.keep_{j}": keep for j, keep in enumerate(keeps)})
    out.update({f"r{i}.raw.{name}": array for name, array in arrays.items()})
    return out


def _take_event_fidelity(i: int, document: dict) -> dict[str, np.ndarray]:
    """Move the per-event fidelity lists a lockstep replay attaches (``info["fidelity"]``) out of the
    document into arrays (float32, as they were computed: exact, and far smaller than JSON numbers)."""
    events = document["events"]
    lengths = [len(e["info"]["fidelity"]["nll"]) if "fidelity" in e.get("info", {}) else -1 for e in events]
    if all(n < 0 for n in lengths):
        return {}
    lists = [e["info"].pop("fidelity") for e in events if "fidelity" in e.get("info", {})]
    out = {f"r{i}.efid.lengths": np.array(lengths, dtype=np.int64)}
    for name in ("nll", "nll_full", "kl", "top1"):
        values = [np.nan if v is None else v for chunk in lists for v in chunk[name]]
        out[f"r{i}.efid.{name}"] = np.array(values, dtype=bool if name == "top1" else np.float32)
    return out


def _put_event_fidelity(i: int, arrays: dict[str, np.ndarray], document: dict) -> None:
    """Undo :func:`_take_event_fidelity` (NaN back to ``None``, as the record's JSON writes it)."""
    if f"r{i}.efid.lengths" not in arrays:
        return
    start = 0
    for event, n in zip(document["events"], arrays[f"r{i}.efid.lengths"].tolist()):
        if n < 0:
            continue
        chunk = {}
        for name in ("nll", "nll_full", "kl", "top1"):
            values = arrays[f"r{i}.efid.{name}"][start : start + n].tolist()
            chunk[name] = [None if isinstance(v, float) and v != v else v for v in values]
        event.setdefault("info", {})["fidelity"] = chunk
        start += n


def score_codes(scores: np.ndarray) -> np.ndarray:
    """``(n,)`` float scores as int32 codes of their value to three significant digits
    (``±((exponent + 400) · 1000 + mantissa)`` with the mantissa in 100 … 999; 0: NaN, 1: zero,
    ±2: ±infinity)."""
    values = np.asarray(scores, dtype=np.float64)
    codes = np.zeros(values.shape, dtype=np.int32)
    finite = np.isfinite(values)
    codes[np.isposinf(values)], codes[np.isneginf(values)] = 2, -2
    codes[finite & (values == 0)] = 1
    pick = finite & (values != 0)
    magnitude = np.abs(values[pick])
    exponent = np.floor(np.log10(magnitude)).astype(np.int64)
    for _ in range(2):  # log10 may land a hair off at a power of ten
        mantissa = np.rint(magnitude / 10.0 ** (exponent - 2)).astype(np.int64)
        exponent = exponent + (mantissa >= 1000) - (mantissa < 100)
    mantissa = np.rint(magnitude / 10.0 ** (exponent - 2)).astype(np.int64)
    codes[pick] = (np.sign(values[pick]) * ((exponent + 400) * 1000 + mantissa)).astype(np.int32)
    return codes


def score_values(codes: np.ndarray) -> np.ndarray:
    """The float32 scores :func:`score_codes` stands for."""
    codes = np.asarray(codes, dtype=np.int64)
    values = np.full(codes.shape, np.nan, dtype=np.float64)
    values[codes == 1] = 0.0
    values[codes == 2], values[codes == -2] = np.inf, -np.inf
    pick = np.abs(codes) > 2
    magnitude = np.abs(codes[pick])
    exponent, mantissa = magnitude // 1000 - 400, magnitude % 1000
    values[pick] = np.sign(codes[pick]) * mantissa * 10.0 ** (exponent - 2)
    return values.astype(np.float32)


def _keep_from(counts: np.ndarray, slots: int) -> np.ndarray:
    return counts.astype(np.float32) / float(slots)  # as the engine computes it: holders / slots


def _steps_diff(matrix: np.ndarray) -> np.ndarray:
    return np.diff(matrix, axis=0, prepend=np.zeros((1, matrix.shape[1]), dtype=matrix.dtype))


def _planes(matrix: np.ndarray) -> np.ndarray:
    """``(S, T)`` int32 as ``(4, T, S)`` uint8: byte plane by byte plane, each token's steps together."""
    return np.ascontiguousarray(matrix.astype("<i4").view(np.uint8).reshape(*matrix.shape, 4).transpose(2, 1, 0))


def _unplanes(planes: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(planes.transpose(2, 1, 0)).view("<i4").reshape(planes.shape[2], planes.shape[1])


# ---- loading ------------------------------------------------------------------------------------
def load(path: str | Path) -> Recording:
    """Read a recording written by :func:`save`; :class:`~thinkviz.core.events.RecordingError` for anything
    that is not one in the current formats."""
    path = Path(path)
    if not path.is_file():
        raise RecordingError(f"recording {path.name} does not exist")
    try:
        with zipfile.ZipFile(path) as zf:
            members = {info.filename: info for info in zf.infolist()}
            if set(members) != {MANIFEST, ARRAYS}:
                raise RecordingError(f"{path.name} is not a preset recording (it should hold {MANIFEST} and {ARRAYS})")
            for info in members.values():
                if info.file_size > MAX_RECORDING_BYTES:
                    raise RecordingError(f"{info.filename} is larger than {MAX_RECORDING_BYTES // 2**20} MiB")
            manifest = json.loads(zf.read(MANIFEST).decode("utf-8"))
            arrays = read_arrays(io.BytesIO(zf.read(ARRAYS)))
            same = manifest.get("same", {}) if isinstance(manifest, dict) else {}
            arrays.update({name: arrays[original] for name, original in same.items() if original in arrays})
    except (zipfile.BadZipFile, zlib.error, lzma.LZMAError, OSError, EOFError, ValueError) as exc:
        raise RecordingError(f"{path.name} is damaged or not a preset recording ({exc})") from None
    return _from_manifest(manifest, arrays, path.name)


def _from_manifest(manifest: Any, arrays: dict[str, np.ndarray], name: str) -> Recording:
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise RecordingError(f"{name} is not a preset recording")
    if manifest.get("version") != BUNDLE_VERSION or manifest.get("record_format") != FORMAT_VERSION:
        raise RecordingError(
            f"{name} is in recording format {manifest.get('version')!r}/{manifest.get('record_format')!r}; this "
            f"ThinkViz reads {BUNDLE_VERSION}/{FORMAT_VERSION}: record it again (python -m thinkviz presets record)"
        )
    try:
        records = []
        for i, document in enumerate(manifest["runs"]):
            _put_event_fidelity(i, arrays, document)
            records.append(RunRecord.from_parts(document, _decode_run(i, arrays, document), f"{name} run {i}"))
        fidelity = {
            str(key): TokenFidelity(*(arrays[f"fidelity.{key}.{f}"] for f in FIDELITY_FIELDS))
            for key in manifest["fidelity"]
        }
        timelines = {
            str(view): [
                Step(
                    float(t),
                    str(phase),
                    int(done),
                    int(total),
                    tuple(int(n) for n in events),
                    {str(k): int(v) for k, v in shown.items()},
                )
                for t, phase, done, total, events, shown in steps
            ]
            for view, steps in manifest["timelines"].items()
        }
        segments = {
            int(r): {int(n): list(spans) for n, spans in by.items()} for r, by in manifest.get("segments", {}).items()
        }
        recording = Recording(
            str(manifest["preset"]),
            dict(manifest["signature"]),
            str(manifest["mode"]),
            [str(label) for label in manifest["labels"]],
            records,
            int(manifest["live"]),
            None if manifest["reference"] is None else int(manifest["reference"]),
            fidelity,
            timelines,
            segments,
            dict(manifest.get("recorded", {})),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise RecordingError(f"{name} is incomplete or damaged ({exc!r})") from None
    steps = [s for view in TIMELINES for s in recording.timelines.get(view, [])]
    if (
        not 0 <= recording.live < len(records)
        or set(recording.timelines) != set(TIMELINES)
        or any(len(s.events) != len(records) for s in steps)
    ):
        raise RecordingError(f"{name} is incomplete or damaged (its timelines do not match its runs)")
    return recording


def _decode_run(i: int, arrays: dict[str, np.ndarray], document: dict) -> dict[str, np.ndarray]:
    lengths = arrays[f"r{i}.lengths"]
    codes = np.cumsum(_unplanes(arrays[f"r{i}.scores"]), axis=0, dtype=np.int64)
    out = {f"scores_{j}": score_values(codes[j, :n]) for j, n in enumerate(lengths)}
    if f"r{i}.keep" in arrays:
        geometry = document["meta"]["geometry"]
        slots = int(geometry["layers"]) * int(geometry["kv_heads"])
        counts = np.cumsum(_unplanes(arrays[f"r{i}.keep"]), axis=0, dtype=np.int64)
        out.update({f"keep_{j}": _keep_from(counts[j, :n], slots) for j, n in enumerate(lengths)})
    prefix = f"r{i}.raw."
    out.update({name[len(prefix) :]: array for name, array in arrays.items() if name.startswith(prefix)})
    return out
