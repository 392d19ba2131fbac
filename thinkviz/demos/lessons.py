"""Lessons: a guided tour through preset recordings, one idea a step (``presets/lessons/<name>.yaml``).

A lesson is a title and an ordered list of steps.  Each step names a preset's recording, which
of its runs to show (``run``: a column label; default the Live tab's run) and how (``tab``: the
Live tab's one run or the Compare tab's columns on the chart; ``mode``: the token view mode), the
frame to stop at (a step number or a named moment, :data:`~.lesson_facts.MOMENTS`), the token
positions to highlight, the chart to show (or none: the tokens) and one or two sentences of
narration.  The narration quotes numbers only through placeholders, ``{name}`` for the step's run
or ``{name@label}`` for another run of the same recording (:data:`~.lesson_facts.QUANTITIES`),
filled from the recording when the lesson is built; a digit typed by hand is a problem
:func:`check_lesson` reports, as are a missing or stale recording, a moment that is not found and a
placeholder that does not resolve.  Schema: ``presets/lessons/README.md``.  No model is needed.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..core.events import RecordingError
from ..memory import Projection
from .lesson_facts import FactError, RunAt, divergence_position, moment_frame, number_text, quantity, run_labels
from .presets import PRESETS_DIR, list_presets
from .record import load_preset_recording
from .recordings import Recording, load

LESSONS_DIR = PRESETS_DIR / "lessons"
TABS = ("live", "compare")
# The token view's modes (thinkviz.viz.tokens: MODES and PREDICTION_MODES; a test keeps them equal) and the charts.
MODES = ("importance", "mass", "segments", "evicted", "combined", "predicted", "answer")
CHARTS = ("none", "memory", "fidelity", "keep")
_STEP_KEYS = ("recording", "tab", "run", "mode", "frame", "highlight", "chart", "card", "narration")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w.]*)(?:@([^{}]+))?\}")
_RANGE = re.compile(r"^(\d+)\s*-\s*(\d+)$")


class LessonError(ValueError):
    """A lesson file cannot be read; the one-line message names the file and the problem."""


@dataclass(frozen=True)
class StepSpec:
    """One step as the file writes it (checked for shape, not yet against its recording)."""

    recording: str
    tab: str
    run: str | None
    mode: str
    frame: int | str
    highlight: tuple[Any, ...]
    chart: str
    card: tuple[str, float] | None
    narration: str
    recording_file: Path | None = None  # the lesson's own recording (a .zip beside the lesson file)


@dataclass(frozen=True)
class Lesson:
    name: str
    title: str
    steps: tuple[StepSpec, ...]
    path: Path


@dataclass(frozen=True)
class LessonStep:
    """A step resolved against its recording: the run, the frame, the narration with its numbers."""

    spec: StepSpec
    run: RunAt
    frame: int
    narration: str
    highlight: tuple[int, ...]  # absolute token positions

    @property
    def recording(self) -> Recording:
        return self.run.recording


def list_lessons(directory: Path | str = LESSONS_DIR) -> list[str]:
    directory = Path(directory)
    return sorted(p.stem for p in directory.glob("*.yaml") if p.is_file()) if directory.is_dir() else []


def load_lesson(name_or_path: str | Path, directory: Path | str = LESSONS_DIR) -> Lesson:
    """A lesson by name (a file stem in ``directory``) or by path to a ``.yaml`` file; :class:`LessonError`."""
    if isinstance(name_or_path, Path) or str(name_or_path).endswith((".yaml", ".yml")):
        path = Path(name_or_path)
        if not path.is_file():
            raise LessonError(f"lesson {path}: file not found")
    else:
        known = list_lessons(directory)
        if name_or_path not in known:
            raise LessonError(f"unknown lesson {name_or_path!r}; available: {', '.join(known) or 'none'}")
        path = Path(directory) / f"{name_or_path}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise LessonError(f"lesson {path.name}: cannot read it ({type(exc).__name__})") from None
    where = f"lesson {path.name}"
    if not isinstance(data, dict) or set(data) - {"title", "steps"} or not isinstance(data.get("title"), str):
        raise LessonError(f"{where}: the file must be a mapping of 'title' (text) and 'steps' (a list)")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise LessonError(f"{where}: 'steps' must be a non-empty list")
    specs = tuple(_step(item, f"{where} step {i}", path.parent) for i, item in enumerate(steps, 1))
    return Lesson(path.stem, data["title"].strip(), specs, path)


def named_lesson(name: str) -> Lesson:
    """Lesson ``name`` from the lessons folder, never a path (a link's or a picker's value); :class:`LessonError`."""
    if name not in list_lessons():
        raise LessonError(f"unknown lesson {name[:80]!r}; available: {', '.join(list_lessons()) or 'none'}")
    return load_lesson(name)


def _step(item: Any, where: str, folder: Path) -> StepSpec:
    if not isinstance(item, dict):
        raise LessonError(f"{where}: a step must be a mapping")
    unknown = sorted(str(k) for k in item if k not in _STEP_KEYS)
    if unknown:
        raise LessonError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(_STEP_KEYS)})")
    for key in ("recording", "narration"):
        if not isinstance(item.get(key), str) or not item[key].strip():
            raise LessonError(f"{where}: {key!r} must be a non-empty string")
    choices = {"tab": (TABS, "live"), "mode": (MODES, "combined"), "chart": (CHARTS, "none")}
    picked = {}
    for key, (allowed, default) in choices.items():
        picked[key] = item.get(key, default)
        if picked[key] not in allowed:
            raise LessonError(f"{where}: {key} {picked[key]!r} is not one of: {', '.join(allowed)}")
    frame = item.get("frame", "end")
    if isinstance(frame, bool) or not isinstance(frame, (int, str)):
        raise LessonError(f"{where}: 'frame' must be a step number or a moment's name")
    highlight = item.get("highlight", [])
    if not isinstance(highlight, list) or not all(isinstance(h, (int, str)) for h in highlight):
        raise LessonError(f"{where}: 'highlight' must be a list of positions, ranges (10-20) or segments (think 0)")
    run = item.get("run")
    if run is not None and not isinstance(run, str):
        raise LessonError(f"{where}: 'run' must be a run's label")
    return StepSpec(
        item["recording"],
        picked["tab"],
        run,
        picked["mode"],
        frame,
        tuple(highlight),
        picked["chart"],
        _card(item.get("card"), where),
        " ".join(item["narration"].split()),
        _own_recording(item["recording"], where, folder),
    )


def _own_recording(name: str, where: str, folder: Path) -> Path | None:
    """The file of a step's own recording (``NAME.zip``, a file name beside the lesson, never a path
    elsewhere), or ``None`` for a preset's recording."""
    if not name.endswith(".zip"):
        return None
    if Path(name).name != name or name.startswith("."):
        raise LessonError(f"{where}: a recording of the lesson's own is a file name beside it, not a path")
    return folder / name


def _card(value: Any, where: str) -> tuple[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"model", "gb"}:
        raise LessonError(f"{where}: 'card' must be {{model: NAME, gb: GIB}}")
    try:
        Projection.named(str(value["model"]), float(value["gb"]))
    except (TypeError, ValueError) as exc:
        raise LessonError(f"{where}: card: {exc}") from None
    return str(value["model"]), float(value["gb"])


# ---- resolving against the recordings -----------------------------------------------------------
def _run(spec: StepSpec, recording: Recording, label: str | None) -> RunAt:
    labels = run_labels(recording)
    index = recording.live if label is None else labels.index(label) if label in labels else None
    if index is None:
        raise FactError(f"no run {label!r} in {recording.preset} (its runs: {', '.join(labels)})")
    projection = Projection.named(*spec.card) if spec.card else None
    return RunAt(recording, index, labels[index], projection)


def _frame(spec: StepSpec, run: RunAt) -> int:
    if isinstance(spec.frame, int):
        if not 0 <= spec.frame < run.frames:
            raise FactError(f"frame {spec.frame} is outside run {run.label!r}: its steps go from 0 to {run.frames - 1}")
        return spec.frame
    return moment_frame(run, spec.frame)


def fill(spec: StepSpec, run: RunAt, frame: int, highlight: tuple[int, ...] = ()) -> str:
    """The narration with every placeholder filled; :class:`FactError` for the first that does not resolve,
    or a number typed by hand.  ``highlight``: the step's positions, for ``{highlight_tokens}`` (how many)
    and ``{highlight_kept}`` (how many of them the run's cache still holds somewhere at the frame)."""
    typed = re.search(r"(?<![\w.])\d[\d,.]*", PLACEHOLDER.sub("", spec.narration))
    if typed:
        raise FactError(
            f"narration types the number {typed.group()} by hand; read it from the recording with a placeholder"
        )
    keep = np.asarray(run.record.events[frame].keep_fraction)
    own = {"highlight_tokens": len(highlight), "highlight_kept": int(sum(keep[p] > 0 for p in highlight))}

    def value(match: re.Match) -> str:
        name, label = match.group(1), match.group(2)
        if label is None and name in own:
            if not highlight:
                raise FactError(f"{match.group(0)} does not resolve: the step highlights nothing")
            return number_text(own[name])
        try:
            other = run if label is None else _run(spec, run.recording, label.strip())
            at = frame if label is None else min(frame, other.frames - 1)
            return number_text(quantity(other, at, name))
        except FactError as exc:
            raise FactError(f"{match.group(0)} does not resolve: {exc}") from None

    return PLACEHOLDER.sub(value, spec.narration)


def highlight_positions(spec: StepSpec, run: RunAt, frame: int) -> tuple[int, ...]:
    """The positions ``spec.highlight`` names: numbers, ranges ``a-b``, ``evicted`` (gone everywhere at the
    frame), ``divergence`` (where the run parts from the full cache) or a segment ``kind [index]``
    (``think 0``, ``user``)."""
    record, seen = run.record, int(run.seen()[frame])
    out: set[int] = set()
    for item in spec.highlight:
        text = str(item).strip()
        ranged = _RANGE.match(text)
        if isinstance(item, int) or text.isdigit():
            out.add(int(text))
        elif ranged:
            out.update(range(int(ranged.group(1)), int(ranged.group(2)) + 1))
        elif text == "divergence":
            out.add(_divergence(run))
        elif text == "evicted":
            keep = record.events[frame].keep_fraction
            out.update(int(p) for p in np.flatnonzero(np.asarray(keep) == 0))
        else:
            kind, _, index = text.partition(" ")
            spans = [s for s in record.segments if s["kind"] == kind and (not index or str(s["index"]) == index)]
            if not spans:
                raise FactError(f"highlight {text!r} names no segment of run {run.label!r}")
            for span in spans:
                out.update(range(span["start"], span["end"]))
    bad = sorted(p for p in out if not 0 <= p < seen)
    if bad:
        raise FactError(f"highlight position {bad[0]} is past the {seen:,} tokens seen at this frame")
    return tuple(sorted(out))


def _divergence(run: RunAt) -> int:
    position = divergence_position(run)
    if position is None:
        raise FactError(f"highlight 'divergence': run {run.label!r} never parts from the full cache")
    return position


def resolve_step(spec: StepSpec) -> LessonStep:
    """``spec`` against its recording; :class:`FactError` or :class:`RecordingError` with the one problem."""
    if spec.recording_file is not None:
        recording = load(spec.recording_file)  # the lesson's own: no preset to be current against
    elif spec.recording not in list_presets():
        raise FactError(f"recording {spec.recording!r} names no preset (or a .zip of the lesson's own)")
    else:
        recording = load_preset_recording(spec.recording)
    run = _run(spec, recording, spec.run)
    frame = _frame(spec, run)
    highlight = highlight_positions(spec, run, frame)
    return LessonStep(spec, run, frame, fill(spec, run, frame, highlight), highlight)


def check_lesson(lesson: Lesson) -> list[str]:
    """One line per problem of ``lesson`` (empty: every step resolves)."""
    problems = []
    for number, spec in enumerate(lesson.steps, 1):
        try:
            resolve_step(spec)
        except (FactError, RecordingError) as exc:
            problems.append(f"{lesson.name} step {number}: {exc}")
    return problems


_BUILT: dict[tuple, tuple[LessonStep | str, ...]] = {}
_LOCK = threading.Lock()


def built_steps(lesson: Lesson) -> tuple[LessonStep | str, ...]:
    """Every step of ``lesson`` resolved (a string: why that step cannot be shown), kept per version of the
    file, so that stepping through a lesson draws from memory."""
    stat = lesson.path.stat()
    key = (str(lesson.path), stat.st_mtime_ns, stat.st_size)
    with _LOCK:
        found = _BUILT.get(key)
    if found is None:
        steps: list[LessonStep | str] = []
        for spec in lesson.steps:
            try:
                steps.append(resolve_step(spec))
            except (FactError, RecordingError) as exc:
                steps.append(str(exc))
        found = tuple(steps)
        with _LOCK:
            _BUILT[key] = found
    return found


_WARMING: list[threading.Thread] = []


def warm_up() -> None:
    """Build every lesson once, in the background (reading their recordings takes a second or a few), so
    that the first step a class opens draws at once too.  Started once per process; later calls do nothing."""
    with _LOCK:
        if _WARMING:
            return
        thread = threading.Thread(target=_build_all, name="thinkviz-lessons-warm-up", daemon=True)
        _WARMING.append(thread)
    thread.start()


def _build_all() -> None:
    for name in list_lessons():
        try:
            built_steps(load_lesson(name))
        except (LessonError, OSError):
            continue  # the tab says why when the lesson is opened
