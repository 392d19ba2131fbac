"""The Compare tab: 2–6 columns on the same input, streamed side by side, with fidelity.

A column is a policy with its knobs and a KV format (:class:`~thinkviz.measure.comparison.Column`), so one
policy may stand in several columns ("h2o · recent 32" beside "h2o · recent 128"), each titled by
what sets it apart, and "h2o at 25 %, full precision" can stand beside "the full cache in q4_0";
fidelity is always measured against the full cache at full precision (a ``full`` column in a
quantized format is compared, not the reference).  The runs come from one
:class:`~thinkviz.measure.comparison.Comparison` (or a preset recording's
:class:`~thinkviz.demos.playback.Playback`): generate mode decodes every column and a full-cache
reference round-robin, so the columns grow together, and the fidelity table reports the step at
which each greedy text first leaves the full cache's; then (optionally) the full cache's text is
teacher-forced through fresh copies of the columns in lockstep to measure NLL, KL and top-1
agreement on the same tokens.  Replay mode is one lockstep replay from the start: the columns
stream and the fidelity table fills in as they go.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..measure.comparison import MAX_COLUMNS, MIN_COLUMNS, Column, Comparison
from ..core.engine import DecodeSettings, EngineError
from ..measure.estimate import Speed
from ..core.events import RunRecord
from ..core.faults import guard_frames
from ..core.kvquant import KVQuant
from ..measure.metrics import TokenFidelity, divergence_step, summarize
from ..models.loading import LoadedModel
from ..demos.playback import Playback
from ..policies import Policy
from ..demos.recordings import Recording
from ..units import format_bytes
from ..viz.fidelity import fidelity_figure
from ..viz.compare_chart import compare_memory_figure, series_styles
from ..viz.legend import view_legend
from ..viz.tables import peak_kv_bytes, stats_html
from ..viz.tokens import TokenData, token_view
from ..measure.requests import RunInput, RunInputError, prepare
from .shared_charts import playback_charts
from .stream import TokenChannel
from .throttle import FramePacer, chart_pacer
from .timing import RunTimer, with_time

FIDELITY_COLUMNS = [
    "policy",
    "NLL (nats)",
    "ΔNLL vs full",
    "KL(full‖policy)",
    "top-1 agree",
    "diverges at step",
    "peak KV",
    "kept",
]


@dataclass
class CompareFrame:
    """One screen update: a patch message and a header per column, the overlay (``None``:
    unchanged), the fidelity table."""

    status: str
    messages: list[dict[str, Any]]  # one token-view patch per column
    bus: list[dict[str, Any]]  # what to send: each column's recent patches (see stream)
    headers: list[str]
    legend: str  # the strip over the columns (cache, segments, boxes); each header explains its own heat
    figure: Any | None
    table: list[list[Any]]  # one row per column, every column of FIDELITY_COLUMNS (None: not measured here)
    records: dict[str, RunRecord]  # by column label
    views: list[TokenData]
    done: bool = False
    fidelity: Any | None = None  # the per-token ΔNLL / KL figure (None: unchanged, or nothing measured yet)
    measured: list[TokenFidelity | None] = field(default_factory=list)  # each column's fidelity so far

    @property
    def shown_table(self) -> dict[str, list]:
        """The table as the tab shows it: without a column no row has (a replay has no divergence step)."""
        keep = [i for i, _ in enumerate(FIDELITY_COLUMNS) if any(row[i] is not None for row in self.table)]
        return {"headers": [FIDELITY_COLUMNS[i] for i in keep], "data": [[row[i] for i in keep] for row in self.table]}


def as_columns(columns: Sequence[Column | Policy], kv_quants: Sequence[KVQuant] | None = None) -> list[Column]:
    """Columns, with a bare policy read as that policy in ``kv_quants[i]`` (default: full precision)."""
    if kv_quants is None:
        return [c if isinstance(c, Column) else Column(c) for c in columns]
    if len(kv_quants) != len(columns):
        raise ValueError(f"{len(columns)} columns but {len(kv_quants)} KV formats")
    return [Column(c.policy if isinstance(c, Column) else c, kv) for c, kv in zip(columns, kv_quants)]


def check_columns(columns: Sequence[Column]) -> None:
    """:class:`RunInputError` unless there are 2–6 columns, no two alike, sharing one interval."""
    if not MIN_COLUMNS <= len(columns) <= MAX_COLUMNS:
        raise RunInputError(f"Choose between {MIN_COLUMNS} and {MAX_COLUMNS} columns to compare (got {len(columns)}).")
    seen = [(c.policy.name, sorted(c.policy.config.items()), c.kv_quant) for c in columns]
    if any(seen.count(key) > 1 for key in seen):
        twice = next(c.policy.name for c, key in zip(columns, seen) if seen.count(key) > 1)
        raise RunInputError(
            f"Two columns are the same {twice} with the same knobs in one KV format: each column "
            "can be compared once; vary a knob to compare a policy with itself."
        )
    if len({c.policy.interval for c in columns}) > 1:
        raise RunInputError("Policies compared together must share one interval.")


def check_policies(policies: Sequence[Policy], kv_quants: Sequence[KVQuant] | None = None) -> None:
    """:func:`check_columns` for ``policies`` in ``kv_quants`` (default: full precision)."""
    check_columns(as_columns(policies, kv_quants))


def fidelity_row(name: str, fidelity: TokenFidelity | None, diverged: str | None, record: RunRecord) -> list[Any]:
    """One table row: mean NLL, ΔNLL, KL, top-1 (``—`` until measured), divergence (``None`` in a
    replay, where every run reads the same tokens), peak KV, kept share."""

    def number(value: float, fmt: str) -> str:
        return "—" if not np.isfinite(value) else format(value, fmt)

    last = record.events[-1] if record.events else None
    kept = f"{last.kv_tokens / (last.positions[-1] + 1):.0%}" if last else "—"
    peak = format_bytes(peak_kv_bytes(record)) if last else "—"
    if fidelity is None or len(fidelity.positions) == 0:
        cells = ["—"] * 4
    else:
        s = summarize(fidelity)
        cells = [
            number(s["nll"], ".3f"),
            number(s["nll_delta"], "+.3f"),
            number(s["kl"], ".4f"),
            number(s["top1"], ".1%"),
        ]
    return [name, *cells, diverged, peak, kept]


def column_views(
    mode: str,
    labels: Sequence[str],
    records: Sequence[RunRecord],
    views: Sequence[TokenData],
    fidelity: Sequence[TokenFidelity | None] = (),
) -> tuple[str, list[str]]:
    """The legend over the columns (what the view draws besides heat) and one header per column:
    its label, its policy's heat legend (or why it has none) and its stats strip (with ΔNLL and KL
    once ``fidelity[i]`` is measured)."""
    measured = list(fidelity) + [None] * (len(records) - len(fidelity))
    headers = [
        f"<div class='tv-col-title'>{label}</div>"
        f"{view_legend(mode, record.meta['policy'], view, ('heat',), compact=True)}{stats_html(record, f)}"
        for label, record, view, f in zip(labels, records, views, measured)
    ]
    widest = max(views, key=lambda v: len(v.texts), default=None)
    return view_legend(mode, "", widest, parts=("keep", "segments", "boxes")), headers


def compare_frames(
    loaded: LoadedModel,
    columns: Sequence[Column | Policy],
    run_input: RunInput,
    settings: DecodeSettings,
    cancel: threading.Event,
    channels: Sequence[TokenChannel],
    measure_fidelity: bool = True,
    pacer: FramePacer | None = None,
    kv_quants: Sequence[KVQuant] | None = None,
    *,
    speed: Speed | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[CompareFrame]:
    """Run ``columns`` side by side on ``run_input``; yield paced frames and a final one.

    ``kv_quants[i]``, when given, is the KV format of column ``i`` given as a bare policy;
    ``channels[i]`` streams column ``i``.  In generate mode with ``measure_fidelity``, a
    second phase teacher-forces the full cache's text through the columns.  ``speed`` prices
    the comparison for the status line.  Raises :class:`RunInputError` for input the model
    cannot run and :class:`~thinkviz.core.faults.RunFault` when the model or a policy fails mid-run.
    """
    columns = as_columns(columns, kv_quants)
    check_columns(columns)
    if len(channels) < len(columns):
        raise ValueError(f"{len(columns)} columns need as many channels, got {len(channels)}")
    prompt, trace_ids = prepare(loaded, run_input)
    try:
        driver = Comparison(
            loaded, columns, prompt, trace_ids, settings, cancel, measure=measure_fidelity or run_input.replay
        )
    except EngineError as exc:
        raise RunInputError(str(exc)) from None
    frames = _frames(driver, RunTimer(driver, speed, clock), channels, pacer or FramePacer())
    label = f"the comparison of {', '.join(driver.labels)}"
    try:
        yield from guard_frames(frames, label, loaded.device, passthrough=(EngineError, RunInputError))
    except EngineError as exc:
        raise RunInputError(str(exc)) from None


def playback_frames(
    recording: Recording,
    speed: float,
    cancel: threading.Event,
    channels: Sequence[TokenChannel],
    pacer: FramePacer | None = None,
) -> Iterator[CompareFrame]:
    """:func:`compare_frames` for a preset's recorded comparison, at ``speed`` × the recorded pace (no model)."""
    playback = Playback(recording, "compare", speed, cancel)
    return _frames(playback, RunTimer(playback, None), channels, pacer or FramePacer())


def _table(driver: Comparison | Playback) -> list[list[Any]]:
    """One fidelity row per column; in a generation, the step where its text leaves the full cache's."""
    reference = (
        [t for e in driver.reference.record.events for t in e.token_ids]
        if driver.reference is not None and not driver.replay
        else None
    )
    rows = []
    for i, (label, run) in enumerate(zip(driver.labels, driver.runs)):
        diverged = None
        if reference is not None:
            step = divergence_step(reference, [t for e in run.record.events for t in e.token_ids])
            diverged = "never" if step is None else str(step)
        rows.append(fidelity_row(label, driver.fidelity.get(i), diverged, run.record))
    return rows


def _status(driver: Comparison | Playback, timer: RunTimer, done: bool) -> str:
    where = (
        f"▶ Recording at {'full speed' if driver.speed == float('inf') else f'{driver.speed:g}×'}: "
        if timer.playing
        else ""
    )
    if done:
        if timer.playing:
            made = driver.recording.recorded
            ended = "stopped" if driver.stopped else "played to the end"
            return (
                f"Done ({ended}): a recording made on {made.get('date', '?')} with {made.get('model', '?')} "
                f"({made.get('backend', '?')}), no model needed."
            )
        if driver.cancel.is_set():
            return "Stopped."
        measured = (
            "; NLL / KL / top-1 measured on the full cache's text" if driver.fidelity and not driver.replay else ""
        )
        what = f"{driver.total} trace tokens" if driver.replay else f"{len(driver.fidelity_text)} tokens"
        return f"Done: {what} through {len(driver.labels)} columns{measured}, in {timer.elapsed()}."
    if driver.phase == "prefill":
        prompt = len(driver.runs[0].record.prompt_ids)
        runs = "" if timer.playing else f" in {driver.plan()[0].runs} runs"
        return where + with_time(f"Prefilling {prompt} prompt tokens{runs}…", timer.total())
    if driver.phase == "replay":
        line = f"Replaying in lockstep… {driver.done}/{driver.total} trace tokens"
    elif driver.phase == "generate":
        line = f"Generating round-robin… {driver.done} tokens"
    else:
        line = f"Measuring fidelity: teacher-forcing the full cache's text… {driver.done}/{driver.total}"
    return where + with_time(line, timer.left())


def _frames(
    driver: Comparison | Playback, timer: RunTimer, channels: Sequence[TokenChannel], pacer: FramePacer
) -> Iterator[CompareFrame]:
    channels = list(channels[: len(driver.runs)])
    for channel in channels:
        channel.new_run()
    figure_pacer = chart_pacer()

    def frame(done: bool = False) -> CompareFrame:
        runs = driver.runs
        views = [token_view(run.record) for run in runs]
        messages = [c.message(v, reset=done or not run.record.events) for c, v, run in zip(channels, views, runs)]
        fidelity = [driver.fidelity.get(i) for i in range(len(runs))]
        legend, headers = column_views(channels[0].mode, driver.labels, [r.record for r in runs], views, fidelity)
        records = {label: run.record for label, run in zip(driver.labels, runs)}
        figure = per_token = None
        if figure_pacer.due() or done:
            if isinstance(driver, Playback):
                figure, per_token = playback_charts(driver, done, charts)
            else:
                figure, per_token = charts(driver)
        bus = [m for channel in channels for m in channel.recent()]
        return CompareFrame(
            _status(driver, timer, done),
            messages,
            bus,
            headers,
            legend,
            figure,
            _table(driver),
            records,
            views,
            done,
            per_token,
            fidelity,
        )

    yield frame()
    for _ in driver:
        timer.update()
        if pacer.due():
            yield frame()
    timer.finish()
    yield frame(done=True)


def charts(driver: Comparison | Playback) -> tuple[Any, Any | None]:
    """The columns' memory figure and their per-token fidelity figure (``None`` before any is measured)."""
    runs = driver.runs
    figure = compare_memory_figure({label: run.record for label, run in zip(driver.labels, runs)})
    curves = {
        label: f
        for label, f, column in zip(driver.labels, (driver.fidelity.get(i) for i in range(len(runs))), range(len(runs)))
        if f is not None and column in _evicting(driver)
    }
    if not any(len(c.positions) for c in curves.values()):
        return figure, None
    basis = (driver.reference or runs[0]).record
    return figure, fidelity_figure(curves, basis.segments, texts=basis.texts, styles=series_styles(driver.labels))


def _evicting(driver: Comparison | Playback) -> set[int]:
    """Columns whose fidelity curve means something (not the full cache's own zeros)."""
    return {
        i
        for i, label in enumerate(driver.labels)
        if driver.runs[i].record.meta["policy"] != "full"
        or driver.runs[i].record.meta.get("kv_quant", {}).get("format", "none") != "none"
    }
