"""The Sweep tab: one trace through policies × budgets in lockstep with the full cache, then the
memory-vs-fidelity plot, the table and the result files.

Frames come from :func:`thinkviz.ui.sweep_run.sweep_frames`; this module lays out the controls and
places what each frame carries.
"""

from __future__ import annotations

import tempfile

import gradio as gr

from ...policies import REFERENCE_POLICY, policy_names
from ...measure.replay import load_trace
from ...sweep.grid import check_vary, parse_budgets, parse_policies, parse_vary
from ...viz.pareto import METRICS as PARETO_METRICS
from ...viz.pareto import pareto_figure
from .. import inputs
from ..controls import ControlError, format_knobs, parse_knobs
from ..fields import slider
from ..handlers import MODEL_GROUP, WAITING, run_with_model, shown
from ...measure.requests import RunInputError
from ..session import Session
from ..sweep_run import TABLE_COLUMNS, SweepPreset, export_sweep, ray_target, sweep_frames, sweep_meta
from ..widgets import knob_box
from . import AppContext

DEFAULT_POLICIES = ["window", "h2o"]
PROTECTION = ("protect_system", "protect_question")


def preset_settings(name: str | None) -> SweepPreset | None:
    """What the replay preset ``name`` sets in the tab (``None``: nothing picked)."""
    return SweepPreset.of(shown(inputs.choose_preset, name).preset) if name else None


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
                1,
                128,
                value=first.interval,
                step=1,
                label="Interval (tokens per forward pass)",
                elem_id="tv-sweep-interval",
            )
            with gr.Row():
                protect = [
                    gr.Checkbox(value=bool(first.params.get(key, True)), label=label)
                    for key, label in zip(PROTECTION, ("Protect system prompt", "Protect question"))
                ]
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
        with gr.Column(scale=5, min_width=600):
            status = gr.Markdown("", elem_id="tv-sweep-status", elem_classes="tv-status")
            figure = gr.Plot(label="Memory vs fidelity", elem_id="tv-sweep-pareto")
            table = gr.Dataframe(headers=TABLE_COLUMNS, label="Runs", interactive=False)
            files = gr.File(
                label="Sweep results (CSV, JSON, Pareto plot…)",
                file_count="multiple",
                interactive=False,
                elem_classes="tv-download",
            )

    def pick_preset(name: str | None) -> list:
        chosen = preset_settings(name)
        if chosen is None:
            return [gr.skip()] * 5
        return [
            chosen.policies,
            chosen.interval,
            *(chosen.params.get(key, True) for key in PROTECTION),
            format_knobs(chosen.params),
        ]

    preset.change(
        pick_preset, preset, [policies, interval, *protect, knobs], show_progress="hidden", api_visibility="private"
    )

    # the parameter names are the API's: what /sweep's inputs are called
    def run_sweep(
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
    ):
        def prepare():
            if not trace:
                raise RunInputError("Choose a trace to sweep.")
            chosen = parse_policies(",".join(policies or []))
            own = parse_knobs(knobs, chosen)
            params = {**own, "protect_system": bool(protect_system), "protect_question": bool(protect_question)}
            try:
                varied = parse_vary(vary or "")
                check_vary(chosen, varied)
            except ValueError as exc:
                raise ControlError(f"{exc} (vary)") from None
            both = sorted(set(varied) & set(own))
            if both:
                raise ControlError(f"{', '.join(both)} is both varied and set in the policy knobs: give it one way.")
            running = budget_mode == "fraction"
            if running and "budget" in varied:
                raise ControlError(
                    "The budget is a fraction of the tokens seen: give its values in Budgets, not in Vary a knob."
                )
            return (
                load_trace(trace),
                parse_budgets(budgets or "", running),
                chosen,
                int(interval),
                int(trace_tokens) or None,
                params,
                varied,
            )

        def frames(loaded, request, cancel):
            trace, budget_list, chosen, every, max_tokens, params, varied = request
            ray = ray_target(app.ray_address, app.slot, app.quant_backend)
            for frame in sweep_frames(
                loaded,
                trace,
                chosen,
                budget_list,
                every,
                params,
                fidelity_axis,
                max_trace_tokens=max_tokens,
                ray=ray,
                vary=varied,
            ):
                if frame.rows is None:
                    yield [frame.status, gr.skip(), gr.skip(), gr.skip()]
                    continue
                s.sweep_rows = frame.rows
                meta = sweep_meta(loaded, trace, chosen, budgets, every, max_tokens, params, budget_mode, varied)
                yield [
                    frame.status,
                    frame.figure,
                    frame.table,
                    export_sweep(frame.rows, meta, tempfile.mkdtemp(prefix="thinkviz-sweep-")),
                ]

        yield from run_with_model(app.slot, prepare, frames, lambda _: [WAITING, gr.skip(), gr.skip(), gr.skip()])

    run.click(
        run_sweep,
        [app.session, preset, policies, budgets, interval, *protect, knobs, limit, metric, budget_mode, vary],
        [status, figure, table, files],
        concurrency_limit=1,
        concurrency_id=MODEL_GROUP,
        api_name="sweep",
        show_progress="hidden",
    )

    def replot(s: Session, metric_value: str):
        return gr.skip() if not s.sweep_rows else pareto_figure(s.sweep_rows, metric_value)

    metric.change(replot, [app.session, metric], figure, show_progress="hidden", api_visibility="private")
