"""The Live tab's run: one policy, streamed as paced frames a browser can keep up with.

:func:`live_frames` runs the policy on the model; :func:`playback_frames` plays a preset's recording
of the same run with no model.  Both are plain generators (tests call ``list(...)``) that draw one
driver, a :class:`~thinkviz.measure.comparison.Comparison` of one column or a
:class:`~thinkviz.demos.playback.Playback` of its recording, the same way: after each step they ask the
:class:`~thinkviz.ui.throttle.FramePacer` whether a frame is due, and always end with a final frame.
A frame carries a token-view patch message (see :mod:`thinkviz.ui.stream`), the memory figure, the
stats strip (with ΔNLL and KL once fidelity is measured), the per-token fidelity figure and a status
line saying how long the run will take, how much is left, how long it took; the Gradio wiring only
places them.

With ``measure``, a replay runs in lockstep with the full cache, fidelity growing chunk by chunk; a
generation is followed by teacher-forcing its own text through the policy and the full cache.  A run
of a policy that predicts importance (dynts) that ends with an answer also gets the attention that
answer paid each earlier token (one more forward pass, before the final frame).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any
from collections.abc import Callable, Iterator

from ..measure.answer_attention import attach_answer_attention
from ..measure.comparison import Column, Comparison
from ..core.engine import DecodeSettings, EngineError
from ..measure.estimate import Speed
from ..core.events import RunRecord
from ..core.faults import guard_frames
from ..core.kvquant import KVQuant
from ..memory import Projection, device_memory
from ..models.loading import LoadedModel
from ..demos.playback import Playback
from ..policies import Policy
from ..demos.recordings import Recording
from ..viz.fidelity import fidelity_figure
from ..viz.memory_chart import memory_figure
from ..viz.legend import view_legend
from ..viz.tables import stats_html
from ..viz.tokens import TokenData, token_view
from ..measure.requests import RunInput, RunInputError, prepare
from .shared_charts import playback_charts
from .stream import TokenChannel
from .text import no_markup
from .throttle import FramePacer, chart_pacer
from .timing import RunTimer, with_time


@dataclass
class LiveFrame:
    """One screen update of the Live tab (``figure`` / ``fidelity`` ``None``: that chart is unchanged)."""

    status: str
    message: dict[str, Any]  # this frame's token-view patch
    bus: list[dict[str, Any]]  # what to send: the patch after the channel's recent ones (see stream)
    figure: Any | None
    stats: str
    legend: str  # the legend strip of the view in the channel's mode
    record: RunRecord
    view: TokenData
    device_stats: dict[int, dict]
    done: bool = False
    fidelity: Any | None = None  # the per-token ΔNLL / KL figure


PHASE_VERBS = {
    "replay": "Replaying",
    "generate": "Generating",
    "fidelity": "Measuring fidelity: teacher-forcing the text through the full cache",
}


def status_line(driver: Comparison | Playback, timer: RunTimer, done: bool = False) -> str:
    """One line saying where the run is and how long it takes."""
    record = driver.runs[0].record
    tokens = sum(len(e.token_ids) for e in record.events)
    verb = "replayed" if driver.replay else "generated"
    if timer.playing:
        where = f"▶ Recording at {_speed_text(driver.speed)}: "
        if done:
            stopped = "stopped" if driver.stopped else "played to the end"
            made = driver.recording.recorded
            return (
                f"Done: {tokens} tokens {verb} ({stopped}) — a recording made on {made.get('date', '?')} "
                f"with {made.get('model', '?')} ({made.get('backend', '?')}), no model needed."
            )
    else:
        where = ""
        if done:
            stopped = record.summary.get("stopped", "stopped" if driver.cancel.is_set() else "finished")
            measured = " Attention from the answer measured." if "answer_attention" in record.summary else ""
            return (
                f"Done: {tokens} tokens {verb} (stopped: {stopped}) in {timer.elapsed()}.{measured}{thinking(driver)}"
            )
    if driver.phase == "prefill":
        line = with_time(f"Prefilling {len(record.prompt_ids)} prompt tokens…", timer.total())
        return where + line + ("" if timer.playing else thinking(driver))
    last = record.events[-1] if record.events else None
    if driver.phase == "fidelity":
        line = f"{PHASE_VERBS['fidelity']}… {driver.done}/{driver.total}"
    else:
        count = f"{driver.done}/{driver.total} trace tokens" if driver.replay else f"{tokens} tokens"
        held = f", cache holds {last.kv_tokens} per layer and head" if last is not None else ""
        line = f"{PHASE_VERBS[driver.phase]}… {count}{held}"
    return where + with_time(line, timer.left())


def thinking(driver: Comparison) -> str:
    """How the model was asked to think, for a generation (``""`` for a replay: the trace decides):
    its own reasoning format, or none of its own (prompted to think)."""
    if driver.replay:
        return ""
    return f" Reasoning: {no_markup(driver.prompt.reasoning.describe())}."  # "<think>" shown, not parsed


def _speed_text(speed: float) -> str:
    return "full speed" if speed == float("inf") else f"{speed:g}×"


def live_frames(
    loaded: LoadedModel,
    policy: Policy,
    run_input: RunInput,
    settings: DecodeSettings,
    cancel: threading.Event,
    channel: TokenChannel,
    projection: Projection | None = None,
    pacer: FramePacer | None = None,
    figure_pacer: FramePacer | None = None,
    kv_quant: KVQuant = KVQuant(),
    *,
    show_device: bool = False,
    measure: bool = False,
    speed: Speed | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[LiveFrame]:
    """Run ``policy`` on ``run_input`` (its cache in ``kv_quant``) and yield frames at the pacer's rate,
    then a final one.

    ``projection`` and ``show_device`` (the process's memory and the weights) say what the memory
    figure shows besides the cache; ``measure`` measures fidelity against the full cache;
    ``speed`` (the machine's, :func:`~thinkviz.measure.estimate.measure_speed`) prices the run for the
    status line, and learns from it when it ends.

    The figures are rebuilt only when ``figure_pacer`` allows (default :func:`~.throttle.chart_pacer`:
    every five seconds, not in the first frame; ``None`` in the frames between) and in the last
    frame: a plotly figure costs far more to build and redraw than a token patch.  ``channel`` may
    be switched to another view mode from outside while the run streams; the next frame then
    resets the view.  Raises
    :class:`RunInputError` for input the model cannot run and :class:`~thinkviz.core.faults.RunFault`
    when the model or the policy fails mid-run (the run is dropped and device memory released first).
    """

    def frames() -> Iterator[LiveFrame]:  # nothing runs, not even the input's checks, before the first frame
        prompt, trace_ids = prepare(loaded, run_input)
        try:
            driver = Comparison(
                loaded,
                [Column(policy, kv_quant)],
                prompt,
                trace_ids,
                settings,
                cancel,
                measure=measure,
                reference_run=False,
            )
        except EngineError as exc:
            raise RunInputError(str(exc)) from None

        def ending() -> None:  # what the answer used, beside what was predicted
            if policy.predicts_importance and not cancel.is_set():
                attach_answer_attention(loaded, driver.runs[0].record)

        yield from _frames(
            driver,
            RunTimer(driver, speed, clock),
            loaded.device,
            channel,
            projection,
            pacer or FramePacer(),
            figure_pacer or chart_pacer(),
            show_device,
            ending,
        )

    return guard_frames(frames(), f"the {policy.name} run", loaded.device, passthrough=(RunInputError,))


def playback_frames(
    recording: Recording,
    speed: float,
    cancel: threading.Event,
    channel: TokenChannel,
    projection: Projection | None = None,
    pacer: FramePacer | None = None,
    figure_pacer: FramePacer | None = None,
    *,
    show_device: bool = False,
) -> Iterator[LiveFrame]:
    """:func:`live_frames` for a preset's recorded Live run, at ``speed`` × the recorded pace (no model)."""
    playback = Playback(recording, "live", speed, cancel)
    return _frames(
        playback,
        RunTimer(playback, None),
        None,
        channel,
        projection,
        pacer or FramePacer(),
        figure_pacer or chart_pacer(),
        show_device,
    )


def charts(
    driver: Comparison | Playback, projection: Projection | None, device_stats: dict[int, dict], show_device: bool
) -> tuple[Any, Any | None]:
    """The memory figure and the per-token fidelity figure (``None`` before any is measured) of ``driver``'s run."""
    record, fidelity = driver.runs[0].record, driver.fidelity.get(0)
    curve = None
    if fidelity is not None and len(fidelity.positions):
        curve = fidelity_figure({driver.labels[0]: fidelity}, record.segments, texts=record.texts)
    return memory_figure(record, projection=projection, device_stats=device_stats, show_device=show_device), curve


def _frames(
    driver,
    timer,
    device,
    channel,
    projection,
    pacer,
    figure_pacer,
    show_device,
    ending: Callable[[], None] | None = None,
) -> Iterator[LiveFrame]:
    """The frames of one driver: the first before it starts, one when due after a step, a final one
    (after ``ending()``, when given)."""
    device_stats: dict[int, dict] = {}  # step -> device memory, sampled once per frame
    policy = driver.runs[0].record.meta["policy"]
    channel.new_run()

    def frame(done: bool = False) -> LiveFrame:
        record = driver.runs[0].record
        if record.events and device is not None:
            device_stats[record.events[-1].step] = device_memory(device)
        view = token_view(record)
        figure = curve = None
        if figure_pacer.due() or done:
            if isinstance(driver, Playback):
                draw = partial(charts, projection=projection, device_stats={}, show_device=show_device)
                figure, curve = playback_charts(driver, done, draw, projection, show_device)
            else:
                figure, curve = charts(driver, projection, device_stats, show_device)
        return LiveFrame(
            status=status_line(driver, timer, done),
            message=channel.message(view, reset=done or not record.events),
            bus=channel.recent(),
            figure=figure,
            stats=stats_html(record, driver.fidelity.get(0)),
            legend=view_legend(channel.mode, policy, view),
            record=record,
            view=view,
            device_stats=device_stats,
            done=done,
            fidelity=curve,
        )

    yield frame()
    try:
        for _ in driver:
            timer.update()
            if pacer.due():
                yield frame()
    except EngineError as exc:
        raise RunInputError(str(exc)) from None
    if ending is not None:
        ending()
    timer.finish()
    yield frame(done=True)
