"""What every Gradio handler shares: the user errors it shows, and the one way to run the model.

A handler is a module-level function of its tab's components and the event's values, bound to
the components with :func:`~thinkviz.ui.wiring.bind`; it returns (or yields, frame by frame) ``{component: value}``
for the outputs it updates, so nothing depends on the order of a list of outputs.

A handler that runs the model follows :func:`run_with_model`: validate the controls (a bad
value is a toast, before anything waits), take a place in the model's line (:mod:`.room`: one
job per client, a student's capped), wait there showing its place, wait for the model to load,
borrow it for the run, show any user error the run raises as a toast, and always leave the line
and mark the session idle after.  Events that run the model share one Gradio concurrency group
(:data:`MODEL_GROUP`) wide enough for a room (:data:`~.room.LINE_LIMIT`): they wait in the line,
where each sees its place, and the model runs one of them at a time.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any, TypeVar
from collections.abc import Callable, Iterator, Mapping, Sequence

import gradio as gr
from gradio.context import LocalContext

from ..core.events import RecordingError, RunRecord
from ..export import export_figures, export_recording
from ..core.faults import RunFault
from ..models.loading import LoadedModel
from .controls import ControlError
from .model_slot import ModelSlot, ModelUnavailable
from .room import CURRENT, LINE_LIMIT, PLAYBACK_LIMIT, Refused, Ticket, run_size
from ..measure.requests import RunInputError
from .session import Session
from .stream import chart_frame
from .throttle import streaming
from .text import no_markup

if TYPE_CHECKING:
    from .tabs import AppContext, ExploreLink

MODEL_GROUP = "model"  # every event that runs the model: in the room's line, one running at a time
MODEL_LIMIT = LINE_LIMIT  # Gradio lets this many in at once: they wait in the line, not in Gradio's queue
PLAYBACK_GROUP = "playback"  # playing recordings needs no model: beside a run, a room's worth at a time
USER_ERRORS = (ControlError, RunInputError, ModelUnavailable, RecordingError, RunFault, Refused, ValueError)
WAITING = "Waiting for the model to load…"
RUN_PICKER_INFO = "this session's runs, newest first (the oldest go when they outgrow the session's budget)"

Request = TypeVar("Request")
Updates = dict[Any, Any]  # {component: value} for the outputs a handler changes (the others stay)


def user_error(exc: Exception) -> gr.Error:
    """A toast with the exception's message (no traceback: the message says what to change)."""
    return gr.Error(no_markup(str(exc)), print_exception=False)  # toasts render HTML


def shown(compute: Callable[..., Any], *args: Any) -> Any:
    """``compute(*args)``, with a user error turned into a toast."""
    try:
        return compute(*args)
    except USER_ERRORS as exc:
        raise user_error(exc) from None


def run_with_model(
    slot: ModelSlot,
    prepare: Callable[[], Request],
    run: Callable[[LoadedModel, Request, threading.Event | None], Iterator[Any]],
    waiting: Callable[[Request, str], Any],
    session: Session | None = None,
) -> Iterator[Any]:
    """The skeleton of a handler that runs the model; yields the outputs of each frame.

    ``prepare()`` validates the controls into a request; the request joins the model's line
    (:meth:`~.room.Room.admit`: refused, as a toast, over a student's cap or while this client has a
    job in line); ``waiting(request, line)`` is the outputs that show ``line`` (its place in the line,
    then that the model is still loading); ``run(loaded, request, cancel)`` yields each frame's
    outputs.  With a ``session``, the run gets a fresh cancel event (its Stop button sets it, in
    the line too) and the session is marked running until the run ends, however it ends.
    """
    request = shown(prepare)
    room = slot.room
    user, client = asker(session)
    ticket = shown(room.admit, *run_size(request, _token_counter(slot)), user, client, arrival())
    cancel = session.begin() if session is not None else None
    ticket.cancel = cancel or ticket.cancel
    finished = False
    try:
        for line in room.line.turn(ticket):
            yield waiting(request, line)
        if ticket.cancel.is_set():
            yield waiting(request, "Stopped before its turn: it left the line.")
            return
        if not slot.status.ready:
            yield waiting(request, WAITING)
        with slot.use() as loaded:
            room.line.start(ticket)
            yield from reporting(ticket, run(loaded, request, cancel))
            finished = not ticket.cancel.is_set()
    except USER_ERRORS as exc:
        raise user_error(exc) from None
    finally:
        room.line.leave(ticket, finished)
        if session is not None:
            session.running = False


_CALLS = itertools.count()  # a client key for each call made outside any event and session


def asker(session: object | None = None) -> tuple[str | None, str]:
    """The login and the client key of the event being handled: Gradio's ``request.username`` and its
    ``session_hash`` (one per browser tab or ``gradio_client.Client``); outside an event, the
    ``session`` object's identity stands for the client."""
    request = LocalContext.request.get(None)
    user = getattr(request, "username", None)
    client = getattr(request, "session_hash", None)
    if client is None:
        client = f"session-{id(session)}" if session is not None else f"call-{next(_CALLS)}"
    return user, client


def arrival() -> float | None:
    """When the event being handled reached the server's queue (Gradio's own record of it; ``None``
    outside an event or where Gradio keeps none): the model's line is first come, first served."""
    try:
        queue = LocalContext.blocks.get()._queue
        return float(queue.event_analytics[LocalContext.event_id.get()]["time"])
    except (LookupError, AttributeError, TypeError, ValueError):
        return None


def reporting(ticket: Ticket, frames: Iterator[Any]) -> Iterator[Any]:
    """``frames``, each computed with ``ticket`` as :data:`~.room.CURRENT` (Gradio may compute each one in
    another thread), so the run's timer can tell the line how far it is (:func:`~.room.report_progress`)."""
    while True:
        token = CURRENT.set(ticket)
        try:
            frame = next(frames)
        except StopIteration:
            return
        finally:
            CURRENT.reset(token)
        yield frame


def _token_counter(slot: ModelSlot) -> Callable[[str], int] | None:
    """Counts a text's tokens with the loaded model's tokenizer (``None`` before one is loaded)."""
    loaded = slot.loaded
    if loaded is None:
        return None
    return lambda text: len(loaded.tokenizer(text, add_special_tokens=False)["input_ids"])


def run_picker(session: Session, value: str | None = None) -> dict:
    """The update of Explore's run picker once a run is shelved: the session's runs, with a note
    in place of its help text when the recording budget dropped some (``value``: select it)."""
    selected = {} if value is None else {"value": value}
    return gr.update(choices=session.sources(), info=session.shelf.note or RUN_PICKER_INFO, **selected)


def charted(
    bus: Any, messages: list[dict[str, Any]], plots: Mapping[Any, Any], done: bool, revision: str, first: bool
) -> Updates:
    """A frame's updates of the patch ``bus`` (its ``messages``) and of the ``gr.Plot`` components
    ``plots`` maps to the frame's figures (``None``: none due): :func:`~.stream.chart_frame`, by
    component; a plot with no figure to set stays."""
    charts = {plot.elem_id: figure for plot, figure in plots.items()}
    payload, figures = chart_frame(messages, charts, done, revision, first=first)
    return {bus: payload, **{plot: figure for plot, figure in zip(plots, figures) if figure is not None}}


def streamed(
    button: gr.Button,
    handler: Callable[..., Iterator[Any]],
    inputs: list[Any],
    outputs: list[Any],
    explore: ExploreLink,
    api_name: str,
    playback: bool = False,
    inputs_kwargs: dict[str, Any] | None = None,
) -> None:
    """Wire ``button`` to a handler that streams a run's frames into ``outputs``: in the model's
    group (they wait in the model's line) or, a recording's ``playback``, in the playback group (a
    room's worth at a time, never behind a run); then refresh Explore, which may have opened the run
    while it streamed."""
    button.click(
        handler,
        inputs,
        outputs,
        inputs_kwargs=inputs_kwargs,
        concurrency_limit=PLAYBACK_LIMIT if playback else MODEL_LIMIT,
        concurrency_id=PLAYBACK_GROUP if playback else MODEL_GROUP,
        api_name=api_name,
        show_progress="hidden",
    ).then(explore.refresh, explore.inputs, explore.outputs, show_progress="hidden", api_visibility="private")


def play_recording(
    load: Callable[[], Request],
    play: Callable[[Request, threading.Event], Iterator[Any]],
    session: Session,
) -> Iterator[Any]:
    """The skeleton of a handler that plays a recording (no model): ``load()`` reads and checks it (a
    stale or missing one is a toast), ``play(recording, cancel)`` yields each frame's outputs; the
    session is marked running meanwhile, so its Stop button stops the playback."""
    recording = shown(load)
    cancel = session.begin()
    try:
        with streaming():  # many at once: each draws fewer frames (thinkviz.ui.throttle)
            yield from play(recording, cancel)
    except USER_ERRORS as exc:
        raise user_error(exc) from None
    finally:
        session.running = False


def nothing_yet(what: str) -> gr.Error:
    return gr.Error(f"Run something first: there is no {what} to export yet.", print_exception=False)


def recording_file(record: RunRecord | None) -> str:
    """The download of ``record`` (a zip of its JSON + NPZ), or a toast if nothing ran yet."""
    if record is None:
        raise nothing_yet("recording")
    return str(export_recording(record))


def figure_file(ready: bool, figures: Callable[[], dict[str, Any]], stem: str, what: str = "figure") -> str:
    """The download of ``figures()`` (``{title: figure}``) as one offline HTML page, or a toast
    saying there is no ``what`` yet."""
    if not ready:
        raise nothing_yet(what)
    return str(export_figures(shown(figures), stem=stem))


def wire_price(
    app: AppContext,
    handler: Callable[..., Any],
    work: Sequence[Any],
    inputs: list[Any],
    line: Any,
    inputs_kwargs: dict[str, Any] | None = None,
) -> None:
    """Re-price a tab's run into its price ``line`` on any change of the controls ``work`` (those that
    change the work) and on page load, the newest values winning (``always_last``); and once a model is
    loaded or fails (then the price can be computed, or says why not)."""
    listen = {
        "inputs_kwargs": inputs_kwargs,
        "preprocess": False,  # values mid-change (a knob slot re-ranged for another policy) are the policy's to refuse
        "show_progress": "hidden",
        "api_visibility": "private",
    }
    triggers = [control.change for control in work] + [app.demo.load]
    gr.on(triggers, handler, inputs, line, trigger_mode="always_last", **listen)
    # A model loaded re-prices every tab: "multiple", never "always_last" on a trigger other tabs listen to too
    # (AppContext.model_ready says why)
    app.model_ready.change(handler, inputs, line, trigger_mode="multiple", **listen)
