"""What every Gradio handler shares: the user errors it shows, and the one way to run the model.

A handler that runs the model follows :func:`run_with_model`: validate the controls (a bad
value is a toast, before anything waits), wait for the model to load, borrow it for the
run, show any user error the run raises as a toast, and always mark the session idle after.
Events that run the model share one Gradio concurrency group (:data:`MODEL_GROUP`) of size
one, across all sessions.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar
from collections.abc import Callable, Iterator

import gradio as gr

from ..core.events import RecordingError, RunRecord
from ..export import export_figures, export_recording
from ..core.faults import RunFault
from ..models.loading import LoadedModel
from .controls import ControlError
from .model_slot import ModelSlot, ModelUnavailable
from ..measure.requests import RunInputError
from .session import Session
from .text import no_markup

MODEL_GROUP = "model"  # every event that runs the model: one at a time, across all sessions
PLAYBACK_GROUP = "playback"  # playing recordings needs no model: beside a run, a few at a time
USER_ERRORS = (ControlError, RunInputError, ModelUnavailable, RecordingError, RunFault, ValueError)
WAITING = "Waiting for the model to load…"
RUN_PICKER_INFO = "this session's runs, newest first (the oldest go when they outgrow the session's budget)"

Request = TypeVar("Request")


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
    run: Callable[[LoadedModel, Request, threading.Event | None], Iterator[list]],
    waiting: Callable[[Request], list],
    session: Session | None = None,
) -> Iterator[list]:
    """The skeleton of a handler that runs the model; yields the outputs of each frame.

    ``prepare()`` validates the controls into a request; ``waiting(request)`` is the outputs to
    show while the model is still loading; ``run(loaded, request, cancel)`` yields each frame's
    outputs.  With a ``session``, the run gets a fresh cancel event (its Stop button sets it)
    and the session is marked running until the run ends, however it ends.
    """
    request = shown(prepare)
    cancel = session.begin() if session is not None else None
    try:
        if not slot.status.ready:
            yield waiting(request)
        with slot.use() as loaded:
            yield from run(loaded, request, cancel)
    except USER_ERRORS as exc:
        raise user_error(exc) from None
    finally:
        if session is not None:
            session.running = False


def run_picker(session: Session, value: str | None = None) -> dict:
    """The update of Explore's run picker once a run is shelved: the session's runs, with a note
    in place of its help text when the recording budget dropped some (``value``: select it)."""
    selected = {} if value is None else {"value": value}
    return gr.update(choices=session.sources(), info=session.shelf.note or RUN_PICKER_INFO, **selected)


def play_recording(
    load: Callable[[], Request],
    play: Callable[[Request, threading.Event], Iterator[list]],
    session: Session,
) -> Iterator[list]:
    """The skeleton of a handler that plays a recording (no model): ``load()`` reads and checks it (a
    stale or missing one is a toast), ``play(recording, cancel)`` yields each frame's outputs; the
    session is marked running meanwhile, so its Stop button stops the playback."""
    recording = shown(load)
    cancel = session.begin()
    try:
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
