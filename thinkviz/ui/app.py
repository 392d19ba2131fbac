"""The Gradio Blocks: the page header, the tabs (:mod:`thinkviz.ui.tabs`, one module each), and the
pieces every tab streams through.

Every handler turns component values into a request (:mod:`.widgets`, :mod:`.controls`),
drives a plain generator (:mod:`.live_run`, :mod:`.compare_run`, :mod:`.sweep_run`) or a pure
function (:mod:`.explore_views`, :mod:`.learn_cards`, :mod:`thinkviz.export`) and places what it
returns by component (``{component: value}``, :mod:`.handlers`).  Events
that run the model wait in the room's line (:mod:`.room`), one running at a time, and borrow the
model from a :class:`ModelSlot` (:func:`.handlers.run_with_model`); playing a recording, Explore
and Learn never wait for it (:func:`queue_for_a_room`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from collections.abc import Iterator

import gradio as gr

from ..viz.legend import LEGEND_CSS, PIN_JS
from ..viz.tokens import TOKEN_CSS
from . import inputs
from .model_slot import ModelSlot
from .present import PAGE_JS, PRESENT_JS
from .session import RECORDING_BUDGET, Session, Shelf, release
from .stream import PATCH_BUS_JS, RESYNC_BUTTON_ID
from .tabs import AppContext, compare, explore, learn, lessons, live, sweep
from .model_panel import load_status_markdown, model_key
from . import room_panel
from .room import QUEUE_POLLS, SWITCH_INTERVAL, VIEW_LIMIT, Room

APP_CSS = TOKEN_CSS + LEGEND_CSS + (Path(__file__).with_name("app.css")).read_text(encoding="utf-8")


def build_app(
    slot: ModelSlot,
    model: str = "embedded",
    quantization: str = "4bit",
    model_loading: bool = True,
    recording_budget: int = RECORDING_BUDGET,
    ray_address: str | None = None,
    quant_backend: str = "auto",
    room: Room | None = None,
) -> gr.Blocks:
    """The whole UI.  ``slot`` holds the shared model; ``model`` starts loading when a page opens.

    ``model_loading=False`` leaves out the settings panel's model loader and its API endpoint,
    for an app that strangers can reach (any id or local folder could otherwise be loaded).
    ``recording_budget``: bytes of recordings each session keeps (:class:`~.session.Shelf`).
    ``ray_address`` makes the Sweep tab run its groups on that Ray cluster, each worker loading
    the slot's model with ``quant_backend``.  ``room`` (:class:`~.room.Room`): who is the teacher and
    the cap on a student's run, served to a room (its line and panel); by default none.
    """
    if room is not None:
        room.line.fallback = slot.seconds_per_token
        slot.room = room
    with gr.Blocks(title="ThinkViz — KV-cache eviction, live", analytics_enabled=False) as demo:

        def new_session() -> Session:
            """A fresh session (the page calls it on load; a script may, to start over)."""
            return Session(shelf=Shelf(recording_budget))

        session = gr.State(new_session)  # a factory: one Session per browser tab
        with gr.Row(equal_height=True, elem_classes="tv-header"):
            gr.Markdown(
                "## ThinkViz\nWhat a KV-cache eviction policy keeps and drops, inside a real quantized model.",
                elem_classes="tv-title",
            )
            model_status = gr.Markdown(
                load_status_markdown(slot.status), elem_id="tv-model-status", elem_classes="tv-status"
            )
            present = gr.Checkbox(
                False, label="Presentation mode", elem_id="tv-present", container=False, scale=0, min_width=190
            )
        present.change(None, present, None, js=PRESENT_JS)
        model_ready = gr.Textbox(model_key(slot.status), visible="hidden", elem_id="tv-model-ready")
        bus = gr.Textbox(visible="hidden", elem_id="tv-bus")
        bus.change(None, bus, None, js=PATCH_BUS_JS)
        resync = gr.Button(visible="hidden", elem_id=RESYNC_BUTTON_ID)
        resync.click(Session.resync, session, None, queue=False, api_visibility="private")
        app = AppContext(
            demo=demo,
            slot=slot,
            session=session,
            bus=bus,
            model_status=model_status,
            model_ready=model_ready,
            presets=inputs.preset_choices(),
            model=model,
            quantization=quantization,
            model_loading=model_loading,
            ray_address=ray_address,
            quant_backend=quant_backend,
        )
        panel = room_panel.layout(slot.room, inputs.preset_choices()) if slot.room.on else None
        with gr.Tabs() as tabs:
            with gr.Tab("Live", id="live"):
                offer_live_runs = live.build(app)
            with gr.Tab("Compare", id="compare"):
                offer_compare_runs = compare.build(app)
            with gr.Tab("Explore", id="explore") as explore_tab:
                explore_link = explore.build(app, explore_tab)
            with gr.Tab("Sweep", id="sweep"):
                sweep.build(app)
            with gr.Tab("Learn", id="learn"):
                learn.build(app)
            with gr.Tab("Lessons", id=lessons.TAB_ID) as lessons_tab:
                lessons.build(app, tabs, lessons_tab)
        offer_live_runs(explore_link)
        offer_compare_runs(explore_link)
        if panel is not None:
            room_panel.wire(demo, panel, slot.room, session, app.presets)

        def watch_default() -> Iterator[tuple[str, str]]:
            slot.start_once(model, quantization)
            for status in slot.watch():
                yield load_status_markdown(status), model_key(status)

        demo.load(watch_default, None, [model_status, model_ready], show_progress="hidden", api_visibility="private")
        demo.load(None, None, None, js=PIN_JS)  # a click on any token pins its details
        demo.load(None, None, None, js=PAGE_JS)  # notices labelled, charts fitted to their panels

        def release_session(request: gr.Request) -> None:
            """The tab closed or its client went (see thinkviz.ui.session): let go of what it holds."""
            release(demo, session._id, request.session_hash)

        demo.unload(release_session)
    return demo


def queue_for_a_room(demo: gr.Blocks) -> gr.Blocks:
    """Gradio's queue as the app needs it: every event but the model's (its own group, its line) lets a
    room's worth in at once (:data:`~.room.VIEW_LIMIT`), so opening Explore or Learn never waits; and the
    interpreter switches threads often enough (:data:`~.room.SWITCH_INTERVAL`) that a room's playbacks
    do not starve the model's run of it (this process's setting: the app serves from it); an idle queue
    looks for work less often than Gradio's every millisecond (:data:`~.room.QUEUE_POLLS`)."""
    sys.setswitchinterval(SWITCH_INTERVAL)
    demo.queue(default_concurrency_limit=VIEW_LIMIT)
    for name, seconds in QUEUE_POLLS.items():
        if hasattr(demo._queue, name):  # a Gradio that renamed them polls as it likes (a test says so)
            setattr(demo._queue, name, max(seconds, getattr(demo._queue, name)))  # never more often than Gradio
    return demo
