"""The Explore and Sweep tabs wire by name: their handlers return ``{component: value}`` for the
components their tab declares, ``/sweep``'s request is checked by name, and the endpoints keep the
parameter names scripts call them with."""

from __future__ import annotations

import inspect
import threading
from dataclasses import replace

import gradio as gr
import pytest

from thinkviz.core.engine import DecodeSettings
from thinkviz.memory import Projection
from thinkviz.policies import make_policy
from thinkviz.measure.requests import RunInput, RunInputError
from thinkviz.ui import explore_views, inputs
from thinkviz.ui.app import build_app
from thinkviz.ui.controls import ControlError, format_knobs
from thinkviz.ui.live_run import live_frames
from thinkviz.ui.model_slot import ModelSlot
from thinkviz.ui.session import Session
from thinkviz.ui.stream import TokenChannel
from thinkviz.ui.sweep_run import sweep_request
from thinkviz.ui.tabs import explore, sweep
from thinkviz.ui.throttle import FramePacer
from thinkviz.ui.wiring import bind
from tiny_models import tiny_model

SWEEP_PARAMETERS = [
    "trace",
    "policies",
    "budgets",
    "interval",
    "protect_system",
    "protect_question",
    "knobs",
    "trace_tokens",
    "fidelity_axis",
    "budget_mode",
    "vary",
]


@pytest.fixture(scope="module")
def record():
    """A finished 12-token Live run of h2o on a tiny model."""
    settings = DecodeSettings(max_new_tokens=12, stop_at_eos=False)
    run = RunInput(system=None, question="What is 2 + 3?")
    frames = live_frames(
        tiny_model("llama"),
        make_policy("h2o", budget=8, recent=2),
        run,
        settings,
        threading.Event(),
        TokenChannel("t"),
        Projection.named("Qwen3-4B", 8),
        FramePacer(0.0),
    )
    return list(frames)[-1].record


@pytest.fixture(scope="module")
def trace() -> str:
    """The replay preset with the shortest trace."""
    return inputs.replay_choices(inputs.preset_choices())[1]


def test_bind_keeps_the_handler_name_docstring_and_its_other_parameters():
    def handler(views, s, trace, budgets):
        """What the endpoint does."""

    event = bind(handler, object())
    assert event.__name__ == "handler" and event.__doc__ == "What the endpoint does."
    assert list(inspect.signature(event).parameters) == ["s", "trace", "budgets"]


def test_the_endpoints_keep_their_parameter_names():
    endpoints = build_app(ModelSlot()).get_api_info()["named_endpoints"]
    named = {name: [p["parameter_name"] for p in endpoints[name]["parameters"]] for name in endpoints}
    assert named["/sweep"] == SWEEP_PARAMETERS
    assert named["/open_recording"] == ["files", "view_mode"]
    assert named["/export_keep_figure"] == ["step", "layer", "kv_head", "view_mode"]
    assert named["/export_explored_recording"] == []


def _sweep(preset, **changes):
    values = dict(
        trace=preset,
        policies=["h2o"],
        budgets="0.5, 64",
        budget_mode="tokens",
        interval=8.0,
        protect_system=True,
        protect_question=False,
        knobs="",
        trace_tokens=0.0,
        vary="",
    )
    return sweep_request(**{**values, **changes})


def test_a_sweep_request_names_what_the_controls_say(trace):
    request = _sweep(trace, knobs="recent=4", trace_tokens=64.0, vary="budget=32,64")
    assert request.policies == ["h2o"] and request.interval == 8 and request.max_trace_tokens == 64
    assert request.params == {"recent": "4", "protect_system": True, "protect_question": False}
    assert request.vary == {"budget": ["32", "64"]} and request.budgets_text == "0.5, 64"
    assert [(b.value, b.fraction) for b in request.budgets] == [(0.5, True), (64, False)]
    assert _sweep(trace).max_trace_tokens is None  # 0: the whole trace


@pytest.mark.parametrize(
    "changes, error, message",
    [
        ({"trace": None}, RunInputError, "Choose a trace"),
        ({"knobs": "recent=4", "vary": "recent=2,8"}, ControlError, "both varied and set"),
        ({"budget_mode": "fraction", "budgets": "0.5", "vary": "budget=32"}, ControlError, "give its values in"),
        ({"vary": "nosuch=1,2"}, ControlError, r"\(vary\)"),
    ],
)
def test_a_sweep_request_refuses_with_the_reason(trace, changes, error, message):
    with pytest.raises(error, match=message):
        _sweep(trace, **changes)


def test_a_picked_preset_fills_the_sweep_controls_by_name(trace):
    first = sweep.preset_settings(trace)
    with gr.Blocks():
        controls = sweep.sweep_controls(first, *inputs.replay_choices(inputs.preset_choices()))
    filled = sweep.pick_preset(controls, trace)
    assert filled[controls.policies] == first.policies and filled[controls.interval] == first.interval
    assert filled[controls.protect_system] is first.params.get("protect_system", True)
    assert filled[controls.knobs] == format_knobs(first.params)
    assert set(filled) == {
        controls.policies,
        controls.interval,
        controls.protect_system,
        controls.protect_question,
        controls.knobs,
    }
    assert sweep.pick_preset(controls, None) == gr.skip()


def test_explore_opens_a_run_into_its_pickers_and_views_by_name(record):
    with gr.Blocks():
        tab = explore.explore_tab()
    s = Session()
    assert explore.on_select(tab, s, "combined") == gr.skip()  # nothing ran yet
    assert explore.show(tab, s, 0, "all", "all", "combined") == gr.skip()
    label = s.keep_live(record)
    s.live_record = record
    opened = explore.on_select(tab, s, "combined")
    assert set(opened) == {tab.source, *tab.opened()}
    assert opened[tab.source]["value"] == label and opened[tab.step]["value"] == len(record.events) - 1
    assert opened[tab.caption].startswith(f"Step **{record.events[-1].step}**")
    assert explore.refresh(tab, s, "combined") == gr.skip()  # shown whole already
    s.explore_steps = 1  # as if opened while the run streamed
    assert set(explore.refresh(tab, s, "combined")) == set(tab.opened())


def test_explore_moves_the_step_box_only_when_a_snapshot_moves_the_step(record):
    first = record.events[1].step
    thinned = replace(record, snapshots={first: record.snapshots[first]})  # one layer snapshot, at event 1
    with gr.Blocks():
        tab = explore.explore_tab()
    s = Session()
    explore.from_source(tab, s, s.keep_live(thinned), "combined")
    assert set(explore.show(tab, s, 3, "all", "all", "combined")) == set(tab.views())
    assert set(explore.show(tab, s, 1, "0", explore_views.AVERAGE, "combined")) == set(tab.views())
    moved = explore.show(tab, s, 3, "0", explore_views.AVERAGE, "combined")
    assert set(moved) == {*tab.views(), tab.step} and moved[tab.step]["value"] == 1
    with pytest.raises(gr.Error, match="Step must be a whole number"):
        explore.show(tab, s, "x", "all", "all", "combined")


def test_a_model_loaded_re_prices_each_tab_without_deferring_the_others():
    """Gradio 6.31's page re-dispatches a whole trigger event when a deferred ``always_last`` listener
    ends: several such listeners on one trigger can defer each other for ever (the three price lines,
    listening to the model's status, re-ran 8 times a second once a status change came while one was
    being computed)."""
    config = build_app(ModelSlot()).config
    (ready,) = [c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == "tv-model-ready"]
    listeners = [d for d in config["dependencies"] if (ready, "change") in map(tuple, d["targets"])]
    names = {d["api_name"].rstrip("_0123456789") for d in listeners}  # Gradio numbers a second listener's name
    assert names >= {"price_live", "price_compare", "price_sweep", "thinking_switch"}
    assert [d["api_name"] for d in listeners if d["trigger_mode"] == "always_last"] == []
