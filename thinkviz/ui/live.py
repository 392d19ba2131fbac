"""The Live tab's run: one policy, streamed as paced frames a browser can keep up with.

:func:`live_frames` is a plain generator (tests call ``list(live_frames(...))``): it starts
the run, then after each engine step asks the :class:`~thinkviz.ui.throttle.FramePacer`
whether a frame is due, and always ends with a final frame.  A frame carries a token-view
patch message (see :mod:`thinkviz.ui.stream`), the memory figure, the stats strip and a
status line; the Gradio wiring only places them.  A run of a policy that predicts importance
(dynts) that ends with an answer also gets the attention that answer paid each earlier token
(one more forward pass, before the final frame).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Iterator

from ..answer_attention import attach_answer_attention
from ..engine import DecodeSettings, EngineError, Run
from ..events import RunRecord, StepEvent
from ..faults import guard_frames
from ..kvquant import KVQuant
from ..memory import Projection, device_memory
from ..model import LoadedModel
from ..policies import Policy
from ..viz.figures import memory_figure
from ..viz.tables import stats_html
from ..viz.legend import view_legend
from ..viz.tokens import TokenData, token_view
from .runs import RunInput, RunInputError, start_run
from .stream import TokenChannel
from .throttle import FIGURE_INTERVAL, FramePacer

@dataclass
class LiveFrame:
    """One screen update of the Live tab (``figure`` ``None``: the chart is unchanged)."""

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


def status_line(run: Run, event: StepEvent | None, replay: bool, done: bool = False) -> str:
    """One line saying where the run is."""
    record = run.record
    generated = sum(len(e.token_ids) for e in record.events)
    if done:
        stopped = record.summary.get("stopped", "finished")
        measured = " Attention from the answer measured." if "answer_attention" in record.summary else ""
        return f"Done: {generated} tokens {'replayed' if replay else 'generated'} (stopped: {stopped}).{measured}"
    if event is None:
        return f"Prefilling {len(record.prompt_ids)} prompt tokens…"
    verb = "Replaying" if replay else "Generating"
    return f"{verb}… {generated} tokens, cache holds {event.kv_tokens} per layer and head."


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
) -> Iterator[LiveFrame]:
    """Run ``policy`` on ``run_input`` (its cache in ``kv_quant``) and yield frames at the
    pacer's rate, then a final one.

    ``projection`` and ``show_device`` (the process's memory and the weights) say what the memory
    figure shows besides the cache.

    The memory figure is rebuilt only when ``figure_pacer`` allows (default: every two seconds;
    ``figure`` is ``None`` in the frames between) and in the first and last frames: a plotly
    figure costs far more to build and redraw than a token patch.  ``channel`` may be switched
    to another view mode from outside while the run streams; the next frame then resets the
    view.  Raises :class:`RunInputError` for input the model cannot run and
    :class:`~thinkviz.faults.RunFault` when the model or the policy fails mid-run (the run is
    dropped and device memory released first).
    """
    frames = _frames(loaded, policy, run_input, settings, cancel, channel, projection,
                     pacer or FramePacer(), figure_pacer or FramePacer(FIGURE_INTERVAL), kv_quant, show_device)
    return guard_frames(frames, f"the {policy.name} run", loaded.device, passthrough=(RunInputError,))


def _frames(loaded, policy, run_input, settings, cancel, channel, projection, pacer,
            figure_pacer, kv_quant, show_device) -> Iterator[LiveFrame]:
    """The frames of :func:`live_frames`, before :func:`~thinkviz.faults.guard_frames` wraps them."""
    run, events = start_run(loaded, policy, run_input, settings, cancel, kv_quant)
    device_stats: dict[int, dict] = {}  # step -> device memory, sampled once per frame

    def frame(event: StepEvent | None, done: bool = False) -> LiveFrame:
        if event is not None:
            device_stats[event.step] = device_memory(loaded.device)
        view = token_view(run.record)
        return LiveFrame(
            status=status_line(run, event, run_input.replay, done),
            message=channel.message(view, reset=done or event is None),
            bus=channel.recent(),
            figure=memory_figure(run.record, projection=projection, device_stats=device_stats, show_device=show_device)
            if figure_pacer.due() or done else None,
            stats=stats_html(run.record),
            legend=view_legend(channel.mode, policy.name, view),
            record=run.record,
            view=view,
            device_stats=device_stats,
            done=done,
        )

    yield frame(None)
    event = None
    try:
        for event in events:
            if pacer.due():
                yield frame(event)
    except EngineError as exc:
        raise RunInputError(str(exc)) from None
    if policy.predicts_importance and not cancel.is_set():
        attach_answer_attention(loaded, run.record)  # what the answer used, beside what was predicted
    yield frame(event, done=True)
