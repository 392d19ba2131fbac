"""The Sweep tab: one trace through policies × budgets in lockstep with the full cache, then the
memory-vs-fidelity plot, the table and the result files.

Frames come from :func:`thinkviz.ui.sweep_run.sweep_frames`; this module lays out the controls
(:class:`SweepControls`, :class:`SweepViews`) and places what each frame carries, by name.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from ...models.loading import LoadedModel
from ...policies import REFERENCE_POLICY, policy_names
from ...viz.pareto import METRICS as PARETO_METRICS
from ...viz.pareto import pareto_figure
from .. import inputs
from ..controls import format_knobs
from ..fields import slider
from ..handlers import MODEL_GROUP, MODEL_LIMIT, run_with_model, shown, wire_price
from ..price import sweep_price
from ..session import Session
from ..sweep_run import (
    TABLE_COLUMNS,
    SweepPreset,
    SweepRequest,
    export_sweep,
    ray_target,
    sweep_frames,
    sweep_meta,
    sweep_request,
)
from ..widgets import knob_box
from ..wiring import bind
from . import AppContext

DEFAULT_POLICIES = ["window", "h2o"]
PROTECTION = ("protect_system", "protect_question")  # the knobs with a checkbox each (SweepControls' names)


@dataclass(frozen=True)
class SweepControls:
    """What the user sets: the trace, the policies and budgets, their knobs, the fidelity axis."""

    preset: gr.Dropdown
    policies: gr.CheckboxGroup
    budgets: gr.Textbox
    budget_mode: gr.Radio
    interval: gr.Slider
    protect_system: gr.Checkbox
    protect_question: gr.Checkbox
    knobs: gr.Textbox
    vary: gr.Textbox
    limit: gr.Slider
    metric: gr.Radio
    run: gr.Button

    def endpoint(self) -> dict[str, gr.components.Component]:
        """The inputs of ``/sweep`` by its parameter names (the API's, in its order)."""
        return {
            "trace": self.preset,
            "policies": self.policies,
            "budgets": self.budgets,
            "interval": self.interval,
            "protect_system": self.protect_system,
            "protect_question": self.protect_question,
            "knobs": self.knobs,
            "trace_tokens": self.limit,
            "fidelity_axis": self.metric,
            "budget_mode": self.budget_mode,
            "vary": self.vary,
        }


@dataclass(frozen=True)
class SweepViews:
    """What a sweep shows: its status line, the Pareto plot, the runs' table and the result files."""

    status: gr.Markdown
    price: gr.Markdown  # what the sweep the controls describe would take here
    figure: gr.Plot
    table: gr.Dataframe
    files: gr.File

    def outputs(self) -> list[gr.components.Component]:
        return [self.status, self.figure, self.table, self.files]


def preset_settings(name: str | None) -> SweepPreset | None:
    """What the replay preset ``name`` sets in the tab (``None``: nothing picked)."""
    return SweepPreset.of(shown(inputs.choose_preset, name).preset) if name else None


def sweep_controls(first: SweepPreset, replay: list, shortest: str | None) -> SweepControls:
    """The left column: the trace picker and everything a sweep runs with, set from ``first``."""
    preset = gr.Dropdown(
        replay,
        value=shortest,
        label="Trace",
        elem_id="tv-sweep-preset",
        info="trace file · the preset whose question, policies and knobs come with it",
    )
    policies = gr.CheckboxGroup(
        [n for n in policy_names() if n != REFERENCE_POLICY],
        value=first.policies,
        label="Policies (the full cache is always the reference)",
        elem_id="tv-sweep-policies",
    )
    budgets = gr.Textbox(
        "0.25, 0.5",
        label="Budgets",
        info="fractions of the sequence (0.25) and/or token counts (256), comma-separated",
    )
    budget_mode = gr.Radio(
        ["tokens", "fraction"],
        value="tokens",
        label="Budget mode",
        info="tokens: a fraction is that share of the whole trace, from the start; "
        "fraction: that share of the tokens seen so far, at every step",
        elem_id="tv-sweep-budget-mode",
    )
    interval = slider(
        1, 128, value=first.interval, step=1, label="Interval (tokens per forward pass)", elem_id="tv-sweep-interval"
    )
    with gr.Row():
        protect = {
            key: gr.Checkbox(value=bool(first.params.get(key, True)), label=label)
            for key, label in zip(PROTECTION, ("Protect system prompt", "Protect question"))
        }
    knobs = knob_box("sweep", first.params)
    vary = gr.Textbox(
        "",
        label="Vary a knob",
        placeholder="e.g. recent=16,32,64,128",
        info="KNOB=V1,V2,…: each chosen policy that takes the knob runs once per value "
        "(as bench sweep --vary); several knobs: separate with ;",
        elem_id="tv-sweep-vary",
    )
    limit = slider(
        0,
        8192,
        value=512,
        step=64,
        label="Trace tokens to replay (0 = the whole trace)",
        info="the first tokens of the trace: a quick sweep on a CPU",
        elem_id="tv-sweep-limit",
    )
    metric = gr.Radio(list(PARETO_METRICS), value="kl", label="Fidelity axis")
    run = gr.Button("Run sweep", variant="primary", elem_id="tv-sweep-run")
    return SweepControls(
        preset=preset,
        policies=policies,
        budgets=budgets,
        budget_mode=budget_mode,
        interval=interval,
        knobs=knobs,
        vary=vary,
        limit=limit,
        metric=metric,
        run=run,
        **protect,
    )


def sweep_views() -> SweepViews:
    """The right column: status, plot, table, downloads."""
    return SweepViews(
        status=gr.Markdown("", elem_id="tv-sweep-status", elem_classes="tv-status"),
        price=gr.Markdown("", elem_id="tv-sweep-price", elem_classes=["tv-status", "tv-price"]),
        figure=gr.Plot(label="Memory vs fidelity", elem_id="tv-sweep-pareto"),
        table=gr.Dataframe(headers=TABLE_COLUMNS, label="Runs", interactive=False),
        files=gr.File(
            label="Sweep results (CSV, JSON, Pareto plot…)",
            file_count="multiple",
            interactive=False,
            elem_classes="tv-download",
        ),
    )


def pick_preset(controls: SweepControls, name: str | None) -> dict:
    """A picked trace's preset sets the policies, interval, protection and knobs it comes with."""
    chosen = preset_settings(name)
    if chosen is None:
        return gr.skip()
    return {
        controls.policies: chosen.policies,
        controls.interval: chosen.interval,
        **{getattr(controls, key): chosen.params.get(key, True) for key in PROTECTION},
        controls.knobs: format_knobs(chosen.params),
    }


# /sweep: the parameter names are the API's (SweepControls.endpoint), and no docstring, which would
# become the endpoint's description
def run_sweep(
    app: AppContext,
    views: SweepViews,
    s: Session,
    trace: str | None,
    policies: list[str],
    budgets: str,
    interval: float,
    protect_system: bool,
    protect_question: bool,
    knobs: str,
    trace_tokens: float,
    fidelity_axis: str,
    budget_mode: str,
    vary: str,
) -> Iterator[dict]:
    def prepare() -> SweepRequest:
        return sweep_request(
            trace=trace,
            policies=policies,
            budgets=budgets,
            budget_mode=budget_mode,
            interval=interval,
            protect_system=protect_system,
            protect_question=protect_question,
            knobs=knobs,
            trace_tokens=trace_tokens,
            vary=vary,
        )

    def frames(loaded: LoadedModel, request: SweepRequest, cancel: threading.Event | None) -> Iterator[dict]:
        return sweep_outputs(app, views, s, loaded, request, fidelity_axis)

    yield from run_with_model(app.slot, prepare, frames, lambda _, line: {views.status: line})


def sweep_outputs(
    app: AppContext, views: SweepViews, s: Session, loaded: LoadedModel, request: SweepRequest, metric: str
) -> Iterator[dict]:
    """Each frame of the sweep ``request`` as the views' values; the last one also keeps its rows in
    the session (the fidelity axis replots them) and writes the result files."""
    for frame in sweep_frames(
        loaded,
        request.trace,
        request.policies,
        request.budgets,
        request.interval,
        request.params,
        metric,
        max_trace_tokens=request.max_trace_tokens,
        ray=ray_target(app.ray_address, app.slot, app.quant_backend),
        vary=request.vary,
    ):
        if frame.rows is None:
            yield {views.status: frame.status}
            continue
        s.sweep_rows = frame.rows
        folder = tempfile.mkdtemp(prefix="thinkviz-sweep-")
        yield {
            views.status: frame.status,
            views.figure: frame.figure,
            views.table: frame.table,
            views.files: export_sweep(frame.rows, sweep_meta(loaded, request), folder),
        }


def price_sweep(app: AppContext, views: SweepViews, fidelity_axis: str, **values: Any) -> dict:
    """The price line: how long the sweep the controls describe takes here."""
    return {views.price: sweep_price(app.slot, lambda: sweep_request(**values))}


def replot(s: Session, metric_value: str) -> Any:
    """The last sweep's Pareto plot on another fidelity axis (nothing before a sweep)."""
    return gr.skip() if not s.sweep_rows else pareto_figure(s.sweep_rows, metric_value)


def build(app: AppContext) -> None:
    """Lay out the Sweep tab and wire its events."""
    replay, shortest = inputs.replay_choices(app.presets)
    first = preset_settings(shortest) or SweepPreset(DEFAULT_POLICIES, 32, {})
    gr.Markdown(
        "Replay one trace through every chosen policy at every budget, in lockstep with the full cache, "
        "and plot peak KV memory against fidelity. Long traces take minutes on a CPU."
    )
    with gr.Row():
        with gr.Column(scale=2, min_width=300):
            controls = sweep_controls(first, replay, shortest)
        with gr.Column(scale=5, min_width=600):
            views = sweep_views()
    controls.preset.change(
        bind(pick_preset, controls),
        controls.preset,
        [controls.policies, controls.interval, controls.protect_system, controls.protect_question, controls.knobs],
        show_progress="hidden",
        api_visibility="private",
    )
    controls.run.click(
        bind(run_sweep, app, views),
        [app.session],
        views.outputs(),
        inputs_kwargs=controls.endpoint(),
        concurrency_limit=MODEL_LIMIT,
        concurrency_id=MODEL_GROUP,
        api_name="sweep",
        show_progress="hidden",
    )
    work = [c for c in controls.endpoint().values() if c is not controls.metric]
    wire_price(app, bind(price_sweep, app, views), work, [], views.price, controls.endpoint())
    controls.metric.change(
        replot, [app.session, controls.metric], views.figure, show_progress="hidden", api_visibility="private"
    )
