"""The one data contract shared by the engine, the UI, the benchmarks, tests and export.

A run is a sequence of :class:`StepEvent` (one per decoded token, or one per replayed
chunk) collected into a :class:`RunRecord`.  A record saves to a folder-free pair of
files, ``NAME.json`` (metadata, tokens, per-step scalars) and ``NAME.npz`` (the dense
per-step arrays), and loads back without a model.  Nothing here is ever pickled.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..parser_lock import read_arrays

FORMAT_VERSION = 1

# Largest recording we agree to load (either file), so a hostile upload cannot exhaust memory.
MAX_RECORDING_BYTES = 256 * 1024 * 1024


class RecordingError(ValueError):
    """A recording could not be read: truncated, too big, wrong version or not ours."""


@dataclass
class StepEvent:
    """What one engine step did to the cache.

    Arrays are indexed by *absolute* token position ``0 .. T-1`` where ``T`` is the
    number of tokens seen so far (prompt + generated, including this step's tokens).

    - ``scores``: ``(T,)`` the policy's importance of each position (mean over layers and
      kv-heads of the slots that still hold it; ``nan`` once a position is gone everywhere).
    - ``keep_fraction``: ``(T,)`` fraction of the ``L * H_kv`` (layer, kv-head) slots that
      still hold each position, in ``[0, 1]``.
    - ``kv_bytes``: bytes of the tensors the cache holds (in a quantized format: codes, scales,
      zero points and the full-precision residual), padding included; ``logical_kv_bytes``: the
      part that holds tokens (less than ``kv_bytes`` only when a ragged keep set padded some
      heads); ``full_kv_bytes``: what the ``T`` tokens would take in a full cache at the model's
      own precision.
    - ``kv_tokens``: tokens held per layer and kv-head (on average, rounded, when they differ);
      ``kept``: ``(L, H_kv)`` tokens each layer and kv-head holds (``None`` in recordings made
      before per-layer budgets, when every one held ``kv_tokens``).
    - ``mass``: ``(T,)`` for a policy that fits attention biases (``am``, ``tam`` with
      ``compaction=match``), how many tokens each position stands for: ``e^β`` of its slots'
      bias, averaged over the slots that hold it (``nan`` once gone); ``None`` otherwise.
    """

    step: int
    token_ids: list[int]
    texts: list[str]
    positions: list[int]
    scores: np.ndarray
    keep_fraction: np.ndarray
    evicted: list[int] = field(default_factory=list)
    kv_bytes: int = 0
    kv_tokens: int = 0
    full_kv_bytes: int = 0
    seconds_forward: float = 0.0
    seconds_policy: float = 0.0
    compressed: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    logical_kv_bytes: int | None = None
    kept: np.ndarray | None = None
    mass: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.logical_kv_bytes is None:
            self.logical_kv_bytes = self.kv_bytes

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def kept_counts(self, layers: int, heads: int) -> np.ndarray:
        """``(L, H_kv)`` tokens held per layer and kv-head (``kv_tokens`` everywhere if not recorded)."""
        if self.kept is None:
            return np.full((layers, heads), self.kv_tokens, dtype=np.int64)
        return np.asarray(self.kept, dtype=np.int64)


@dataclass
class RunRecord:
    """A whole run: metadata, the prompt, and every step event.

    ``meta`` holds at least ``model``, ``quantization``, ``policy``, ``params``,
    ``budget``, ``interval``, ``geometry`` (``layers``, ``kv_heads``, ``head_dim``,
    ``dtype_bytes``) and ``weights_bytes``.
    ``prompt_ids`` / ``prompt_texts`` are the prefilled tokens and ``prompt_labels`` their
    segmenter labels (``"template"`` marks chat-template markers; empty when the prompt had no
    roles); ``segments`` is a list of ``{"kind", "index", "start", "end", "protected"}`` spans
    over absolute positions, current while the run streams.
    ``snapshots`` maps a step to its ``(L, H_kv, T)`` boolean keep mask, stored for a
    bounded number of steps so the Explore view can drill into layers and heads.
    """

    meta: dict[str, Any]
    prompt_ids: list[int] = field(default_factory=list)
    prompt_texts: list[str] = field(default_factory=list)
    prompt_labels: list[str] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)
    events: list[StepEvent] = field(default_factory=list)
    snapshots: dict[int, np.ndarray] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)

    # ---- derived views -------------------------------------------------------------
    @property
    def token_ids(self) -> list[int]:
        ids = list(self.prompt_ids)
        for e in self.events:
            ids.extend(e.token_ids)
        return ids

    @property
    def texts(self) -> list[str]:
        out = list(self.prompt_texts)
        for e in self.events:
            out.extend(e.texts)
        return out

    @property
    def generated_text(self) -> str:
        return "".join(e.text for e in self.events)

    @property
    def nbytes(self) -> int:
        """Bytes of the record's arrays: every step's scores and keep fractions (``O(T)`` each, so
        ``O(T²)`` in all) and the snapshot masks.  They are what a long record's memory grows
        with; its token lists and texts add a little on top."""
        arrays = [a for e in self.events for a in (e.scores, e.keep_fraction)] + list(self.snapshots.values())
        return sum(np.asarray(a).nbytes for a in arrays)

    def kv_bytes_series(self) -> np.ndarray:
        """``(S,)`` physical KV bytes after each step."""
        return np.array([e.kv_bytes for e in self.events], dtype=np.int64)

    def logical_kv_bytes_series(self) -> np.ndarray:
        """``(S,)`` KV bytes after each step that hold tokens (the physical bytes minus padding)."""
        return np.array([e.logical_kv_bytes for e in self.events], dtype=np.int64)

    def full_kv_bytes_series(self) -> np.ndarray:
        """``(S,)`` bytes the same steps would hold with nothing evicted."""
        return np.array([e.full_kv_bytes for e in self.events], dtype=np.int64)

    # ---- persistence ---------------------------------------------------------------
    def save(self, path: str | Path) -> tuple[Path, Path]:
        """Write ``path.json`` and ``path.npz`` (suffix of ``path`` is ignored)."""
        base = Path(path).with_suffix("")
        base.parent.mkdir(parents=True, exist_ok=True)
        events_meta = []
        arrays: dict[str, np.ndarray] = {}
        for i, e in enumerate(self.events):
            d = asdict(e)
            d.pop("scores")
            d.pop("keep_fraction")
            d.pop("kept")
            d.pop("mass")
            events_meta.append(_jsonable(d))
            arrays[f"scores_{i}"] = np.asarray(e.scores, dtype=np.float32)
            arrays[f"keep_{i}"] = np.asarray(e.keep_fraction, dtype=np.float32)
            if e.kept is not None:
                arrays[f"kept_{i}"] = np.asarray(e.kept, dtype=np.int32)
            if e.mass is not None:
                arrays[f"mass_{i}"] = np.asarray(e.mass, dtype=np.float32)
        for step, mask in self.snapshots.items():
            mask = np.asarray(mask, dtype=bool)
            arrays[f"snapshot_{step}"] = np.packbits(mask, axis=-1)
            arrays[f"snapshot_shape_{step}"] = np.array(mask.shape, dtype=np.int64)
        doc = {
            "format": "thinkviz-run",
            "version": FORMAT_VERSION,
            "meta": _jsonable(self.meta),
            "prompt_ids": list(map(int, self.prompt_ids)),
            "prompt_texts": list(self.prompt_texts),
            "prompt_labels": list(self.prompt_labels),
            "segments": _jsonable(self.segments),
            "events": events_meta,
            "snapshot_steps": sorted(int(s) for s in self.snapshots),
            "summary": _jsonable(self.summary),
        }
        json_path, npz_path = base.with_suffix(".json"), base.with_suffix(".npz")
        json_path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
        with open(npz_path, "wb") as fh:
            np.savez_compressed(fh, **arrays)
        return json_path, npz_path

    @classmethod
    def load(cls, path: str | Path) -> RunRecord:
        """Load a record saved by :meth:`save`; raises :class:`RecordingError` on bad input."""
        base = Path(path).with_suffix("")
        json_path, npz_path = base.with_suffix(".json"), base.with_suffix(".npz")
        for p in (json_path, npz_path):
            if not p.is_file():
                raise RecordingError(f"recording file {p.name} is missing")
            if p.stat().st_size > MAX_RECORDING_BYTES:
                raise RecordingError(f"recording file {p.name} is larger than {MAX_RECORDING_BYTES // 2**20} MiB")
        try:
            doc = json.loads(json_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RecordingError(f"{json_path.name} is not a ThinkViz recording (bad JSON: {exc})") from exc
        _check_format(doc, json_path.name)
        try:
            arrays = read_arrays(npz_path)
        except Exception as exc:  # zipfile.BadZipFile, ValueError, EOFError, OSError ...
            raise RecordingError(f"{npz_path.name} is not a readable NPZ archive: {exc}") from exc
        return cls.from_parts(doc, arrays, json_path.name)

    @classmethod
    def from_parts(cls, doc: Any, arrays: dict[str, np.ndarray], name: str = "recording") -> RunRecord:
        """The record whose JSON document (parsed) and arrays :meth:`save` would write as ``doc`` and
        ``arrays``, checked as :meth:`load` checks them (:class:`RecordingError`); the arrays are used as
        they are, not copied."""
        _check_format(doc, name)
        _check_document_fields(doc)
        try:
            events = []
            for i, d in enumerate(doc["events"]):
                _check_event_fields(d, i)
                events.append(
                    StepEvent(
                        scores=arrays[f"scores_{i}"],
                        keep_fraction=arrays[f"keep_{i}"],
                        kept=_kept_array(arrays.get(f"kept_{i}"), doc["meta"], i),
                        mass=_mass_array(arrays.get(f"mass_{i}"), arrays[f"scores_{i}"], i),
                        **d,
                    )
                )
            snapshots = {}
            for step in doc.get("snapshot_steps", []):
                shape = tuple(int(x) for x in arrays[f"snapshot_shape_{step}"])
                bits = np.unpackbits(arrays[f"snapshot_{step}"], axis=-1, count=shape[-1])
                snapshots[int(step)] = bits.astype(bool).reshape(shape)
            return cls(
                meta=doc["meta"],
                prompt_ids=doc["prompt_ids"],
                prompt_texts=doc["prompt_texts"],
                prompt_labels=doc.get("prompt_labels", []),
                segments=doc["segments"],
                events=events,
                snapshots=snapshots,
                summary=doc.get("summary", {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordingError(f"recording is incomplete or corrupted ({exc!r})") from exc


def _check_format(doc: Any, name: str) -> None:
    if not isinstance(doc, dict) or doc.get("format") != "thinkviz-run":
        raise RecordingError(f"{name} is not a ThinkViz recording")
    if doc.get("version") != FORMAT_VERSION:
        raise RecordingError(
            f"recording format version {doc.get('version')!r} is not supported "
            f"(this ThinkViz reads version {FORMAT_VERSION})"
        )


_EVENT_SCALARS = {
    "step": int,
    "kv_bytes": int,
    "logical_kv_bytes": int,
    "kv_tokens": int,
    "full_kv_bytes": int,
    "seconds_forward": (int, float),
    "seconds_policy": (int, float),
    "compressed": bool,
}
_EVENT_LISTS = {"token_ids": int, "positions": int, "evicted": int, "texts": str}


_DOCUMENT_FIELDS = {"meta": dict, "prompt_ids": list, "prompt_texts": list, "segments": list, "events": list}


def _check_document_fields(doc: dict) -> None:
    """:class:`RecordingError` unless the top-level fields have their declared types."""
    for key, kind in _DOCUMENT_FIELDS.items():
        if not isinstance(doc.get(key), kind):
            raise RecordingError(f"recording field {key} must be a {kind.__name__}")
    if not isinstance(doc.get("summary", {}), dict):
        raise RecordingError("recording field summary must be a dict")
    if not all(isinstance(t, str) for t in doc["prompt_texts"]):
        raise RecordingError("recording field prompt_texts must be a list of str")
    labels = doc.get("prompt_labels", [])  # absent in recordings made before labels were stored
    if not (isinstance(labels, list) and all(isinstance(t, str) for t in labels)):
        raise RecordingError("recording field prompt_labels must be a list of str")
    if not all(isinstance(i, int) for i in doc["prompt_ids"]):
        raise RecordingError("recording field prompt_ids must be a list of int")
    if not all(isinstance(s, dict) for s in doc["segments"]):
        raise RecordingError("recording field segments must be a list of objects")


def _check_event_fields(d: Any, i: int) -> None:
    """:class:`RecordingError` unless event ``i``'s JSON fields have their declared types
    (a recording is user input: its numbers end up in captions and figures)."""
    if not isinstance(d, dict):
        raise RecordingError(f"recording event {i} is not an object")
    for key, kind in _EVENT_SCALARS.items():
        if key in d and not isinstance(d[key], kind):
            raise RecordingError(f"recording event {i}: {key} must be {_kind_name(kind)}, got {d[key]!r:.40}")
    for key, kind in _EVENT_LISTS.items():
        if key in d and not (isinstance(d[key], list) and all(isinstance(x, kind) for x in d[key])):
            raise RecordingError(f"recording event {i}: {key} must be a list of {_kind_name(kind)}")


def _mass_array(mass: np.ndarray | None, scores: np.ndarray, i: int) -> np.ndarray | None:
    """Event ``i``'s ``(T,)`` mass per position, checked to be one float per position."""
    if mass is None:
        return None
    if mass.shape != np.shape(scores) or mass.dtype.kind != "f":
        raise RecordingError(f"recording event {i}: mass must be {np.shape(scores)} floats")
    return mass


def _kept_array(kept: np.ndarray | None, meta: dict, i: int) -> np.ndarray | None:
    """Event ``i``'s ``(L, H_kv)`` kept counts, checked against the recorded geometry."""
    if kept is None:
        return None
    geometry = meta.get("geometry", {}) if isinstance(meta, dict) else {}
    shape = (geometry.get("layers"), geometry.get("kv_heads"))
    if kept.shape != shape or kept.dtype.kind not in "iu" or (kept < 0).any():
        raise RecordingError(f"recording event {i}: kept counts must be {shape} non-negative integers")
    return kept


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))


def _jsonable(obj: Any) -> Any:
    """Convert numpy scalars/arrays and tuples so ``json.dumps`` accepts them; NaN -> None."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
