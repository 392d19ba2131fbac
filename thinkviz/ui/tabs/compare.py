"""The Compare tab: 2–6 columns on the same input, streaming together, a memory overlay and the
fidelity table; the same policy may fill several columns with different knobs ("vary").

Frames come from :func:`thinkviz.ui.compare_run.compare_frames` (a live run) and
:func:`thinkviz.ui.compare_run.playback_frames` (a preset's recording, no model); this module lays out
the controls and places what each frame carries.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

import gradio as gr

from ...measure.comparison import MAX_COLUMNS, MIN_COLUMNS, Column, preset_policies
from ...core.kvquant import KVQuant
from ...demos.playback import SPEEDS
from ...policies import REFERENCE_POLICY, Policy, make_policy, policy_names
from ...demos.presets import Preset
from ...sweep.grid import check_vary, parse_vary, vary_grid
from ...viz.compare_chart import compare_memory_figure
from ...viz.figures import placeholder_figure
from ...viz.legend import view_legend
from ...viz.tokens import TokenData, view_mode_choices
from .. import inputs
from ..compare_run import FIDELITY_COLUMNS, check_columns, column_views, compare_frames, playback_frames
from ..controls import ControlError, build_policy, default_view, format_knobs, knobs_for, parse_knobs
from ...demos.record import load_preset_recording
from ..price import preset_estimate
from ..handlers import (
    MODEL_GROUP,
    PLAYBACK_GROUP,
    USER_ERRORS,
    WAITING,
    figure_file,
    play_recording,
    run_picker,
    run_with_model,
)
from ..session import COMPARE_TOKENS_IDS, Session
from ..stream import bus_payload, chart_frame, container_html
from ..text import plain_markdown
from ..widgets import (
    CommonControls,
    Group,
    InputControls,
    PlaybackControls,
    common_controls,
    decode_controls,
    follow_toggle,
    input_controls,
    knob_box,
    kv_format_dropdown,
    named,
    playback_controls,
    preset_knobs,
    preset_values,
    residual_slider,
    split,
    trace_limit,
)
from . import AppContext, ExploreLink

DEFAULT_POLICIES = [REFERENCE_POLICY, "window", "h2o"]
MEMORY_ID, FIDELITY_ID = "tv-compare-memory", "tv-compare-fidelity"  # the charts a run redraws in place


def column_view_choices(policies: Sequence[Policy]) -> list[tuple[str, str]]:
    """The token views Compare offers for these columns: ``mass`` when one of them fits attention
    biases (the others then show no heat in it)."""
    return view_mode_choices(False, any(policy.fits_bias for policy in policies))


@dataclass
class PolicySetControls(Group):
    """The policies to compare, the knobs they share, their own knobs, and whether to measure fidelity afterwards."""

    policies: gr.CheckboxGroup
    common: CommonControls
    knobs: gr.Textbox
    measure_fidelity: gr.Checkbox

    def inputs(self) -> list:
        return [self.policies, *self.common.inputs(), self.knobs, self.measure_fidelity]

    def make(self, values: Sequence[Any], vary_text: str | None = None) -> tuple[list[Policy], bool]:
        """The policies of the columns (2–6) and the measure-fidelity flag from the values in
        :meth:`inputs` order: each checked policy with the knobs it declares, once per combination of
        the knobs ``vary_text`` varies that it declares (``recent=32,128``: two columns of each policy
        that takes ``recent``)."""
        names, *common, knob_text, measure = values
        names = list(names or [])
        own = parse_knobs(knob_text, names)
        try:
            vary = parse_vary(vary_text or "")
            check_vary(names, vary)
        except ValueError as exc:
            raise ControlError(f"{exc} (vary)") from None
        shared = self.common.knobs(common)
        policies = []
        for name in names:
            for combo in vary_grid(name, vary):
                knobs = {**knobs_for(name, own), **{k: v for k, v in combo.items() if k not in shared}}
                overrides = {k: v for k, v in combo.items() if k in shared}
                policies.append(build_policy(name, knobs, **{**shared, **overrides}))
        check_columns([Column(policy) for policy in policies])
        return policies, bool(measure)

    @staticmethod
    def preset_values(preset: Preset, policies: list[str]) -> list:
        """Values for :meth:`inputs` (without the measure flag) that compare ``policies`` with ``preset``'s knobs."""
        return [policies, *preset_knobs(preset.params), format_knobs(preset.params)]


def policy_set_controls() -> PolicySetControls:
    policies = gr.CheckboxGroup(
        policy_names(),
        value=DEFAULT_POLICIES,
        label=f"Policies ({MIN_COLUMNS}–{MAX_COLUMNS} columns)",
        elem_id="tv-compare-policies",
        elem_classes="tv-bar",
    )
    common = common_controls("compare", interval=8)
    knobs = knob_box("compare")
    measure = gr.Checkbox(
        value=True,
        label="Measure NLL / KL / top-1 against the full cache",
        info="full precision; generate mode: afterwards, teacher-force the full cache's text",
    )
    return PolicySetControls(policies, common, knobs, measure)


@dataclass
class ColumnFormats(Group):
    """The KV format each policy's column is stored in (one dropdown per registered policy, shown
    while it is checked; a NamedTuple whose fields ``kv_<policy>`` are their API names) and
    KIVI's residual."""

    formats: tuple
    kv_residual: gr.Slider

    def inputs(self) -> list:
        return [*self.formats, self.kv_residual]

    @property
    def policies(self) -> list[str]:
        return [field.removeprefix("kv_") for field in self.formats._fields]

    def kv_quants(self, values: Sequence[Any], names: Sequence[str]) -> list[KVQuant]:
        """The formats of the policies ``names`` from the values in :meth:`inputs` order."""
        *formats, residual = values
        chosen = dict(zip(self.policies, formats))
        return [inputs.kv_quant(chosen.get(name, "none"), residual) for name in names]

    def shown(self, names: Sequence[str]) -> list:
        """Updates showing the dropdowns of the checked policies ``names``."""
        return [gr.update(visible=name in names) for name in self.policies]

    def preset_values(self, preset: Preset, known: Sequence[str], formats: Sequence[KVQuant]) -> list:
        """Values for :meth:`inputs` that store the columns ``known`` in ``formats`` (one each)."""
        residual = next((f.residual for f in formats if f.spec.grouped), preset.kv_quant.residual)
        chosen = dict(zip(known, (f.format for f in formats)))
        return [*(gr.update(value=chosen.get(name, "none"), visible=name in known) for name in self.policies), residual]


def column_formats() -> ColumnFormats:
    names = policy_names()
    with gr.Accordion("KV-cache format of each column", open=False, elem_id="tv-compare-kv"):
        formats = namedtuple("ColumnFormat", [f"kv_{name}" for name in names])(
            *(
                kv_format_dropdown(f"compare-{name}", f"{name}: KV format", visible=name in DEFAULT_POLICIES)
                for name in names
            )
        )
        residual = residual_slider("compare")
    return ColumnFormats(formats, residual)


@dataclass
class CompareOptions(Group):
    """What Compare adds after the shared groups (at the end of its API): the trace tokens to replay
    and the knob to vary across columns."""

    max_trace_tokens: gr.Slider
    vary: gr.Textbox

    def inputs(self) -> list:
        return [self.max_trace_tokens, self.vary]


def compare_options() -> CompareOptions:
    limit = trace_limit("compare")
    vary = gr.Textbox(
        "",
        label="Vary a knob across columns",
        placeholder="e.g. recent=32,128",
        info="KNOB=V1,V2,…: each checked policy that takes the knob gets one column per value "
        "(h2o · recent 32 beside h2o · recent 128); several knobs: separate with ;",
        elem_id="tv-compare-vary",
    )
    return CompareOptions(limit, vary)


def build(app: AppContext) -> Callable[[ExploreLink], None]:
    """Lay out the Compare tab; returns the function that wires Compare once the Explore tab exists."""
    with gr.Row(elem_classes="tv-layout"):
        with gr.Column(scale=2, min_width=300, elem_classes="tv-controls"):
            panel = input_controls(app.presets, "compare", app.slot)
            with gr.Row(elem_classes="tv-bar"):
                run = gr.Button("Compare", variant="primary", elem_id="tv-compare-run")
                stop = gr.Button("Stop", variant="stop", elem_id="tv-compare-stop")
                playback = playback_controls("compare")
            chosen = policy_set_controls()
            kv = column_formats()
            options = compare_options()
            decode = decode_controls("compare")
        with gr.Column(scale=5, min_width=600, elem_classes="tv-outputs"):
            status = gr.Markdown(
                "Pick 2–6 policies and press Compare.", elem_id="tv-compare-status", elem_classes="tv-status"
            )
            with gr.Row(equal_height=True):
                view_mode = gr.Radio(
                    column_view_choices([make_policy(name) for name in DEFAULT_POLICIES]),
                    value="combined",
                    label="Token view",
                    elem_id="tv-compare-mode",
                    scale=4,
                )
                follow_toggle("compare")
            legend = gr.HTML(
                view_legend("combined", "", None, parts=("keep", "segments", "boxes")), elem_id="tv-compare-legend"
            )
            headers, columns = [], []
            with gr.Row(elem_classes="tv-compare"):
                for i, target_id in enumerate(COMPARE_TOKENS_IDS):
                    with gr.Column(visible=i < 3, min_width=220) as column:
                        headers.append(gr.HTML("", elem_id=f"tv-compare-head-{i}"))
                        gr.HTML(container_html(target_id, follow="tv-compare-follow"))
                    columns.append(column)
            overlay = gr.Plot(
                placeholder_figure("Each policy's KV cache appears here"),
                label="KV-cache memory, all policies",
                elem_id=MEMORY_ID,
            )
            table = gr.Dataframe(
                headers=FIDELITY_COLUMNS,
                label="Fidelity against the full cache",
                interactive=False,
                elem_id="tv-compare-table",
                wrap=True,
            )
            per_token = gr.Plot(
                placeholder_figure("ΔNLL and KL per token appear here once fidelity is measured"),
                label="Per-token fidelity against the full cache",
                elem_id=FIDELITY_ID,
            )
            with gr.Row():
                export_fig = gr.Button("Export figure (HTML)", size="sm", elem_id="tv-compare-export-figure")
            exported = gr.File(
                label="Download (open a column in Explore to export its recording)",
                interactive=False,
                elem_id="tv-compare-export",
                elem_classes="tv-download",
            )
    session = app.session

    def pick_preset(name: str | None) -> list:
        choice, values = preset_values(name)
        if choice is None:
            return values + [gr.skip()] * (4 + len(chosen.common.inputs()) + len(kv.inputs()))
        known, formats, left_out = preset_policies(choice.preset)
        if left_out:
            values[0] += f"\n\n_Showing {', '.join(known)}; also listed: {plain_markdown(', '.join(left_out))}._"
        view = "combined" if "combined" in map(default_view, known) else "evicted"  # heat if any column has it
        return values + [
            *chosen.preset_values(choice.preset, known),
            choice.preset.max_new_tokens,
            view,
            *kv.preset_values(choice.preset, known, formats),
        ]

    def clear_results(s: Session, mode: str) -> list:
        """A new preset: the last comparison's columns, table and charts go (Explore keeps its runs)."""
        if s.running:
            return [gr.skip()] * (6 + len(headers))
        s.compare_views = []
        empty = [c.message(TokenData([]), reset=True) for c in s.compare_channels]
        return [
            bus_payload(empty),
            *[""] * len(headers),
            {"headers": FIDELITY_COLUMNS, "data": []},
            placeholder_figure("Each policy's KV cache appears here"),
            placeholder_figure("ΔNLL and KL per token appear here once fidelity is measured"),
            view_legend(mode, "", None, parts=("keep", "segments", "boxes")),
        ]

    panel.preset.change(
        pick_preset,
        panel.preset,
        panel.preset_outputs() + chosen.inputs()[:-1] + [decode.max_new_tokens, view_mode] + kv.inputs(),
        show_progress="hidden",
        api_visibility="private",
    ).then(
        clear_results,
        [session, view_mode],
        [app.bus, *headers, table, overlay, per_token, legend],
        show_progress="hidden",
        api_visibility="private",
    ).then(
        lambda name, measure: [
            PlaybackControls.offer(name),
            preset_estimate(app.slot, name, "compare", measure) or gr.skip(),
        ],
        [panel.preset, chosen.measure_fidelity],
        [playback.play, status],
        show_progress="hidden",
        api_visibility="private",
    )
    stop.click(Session.stop, session, None, queue=False, api_name="stop_compare")
    export_fig.click(
        lambda s: figure_file(
            bool(s.compare_records),
            lambda: {"KV cache by policy": compare_memory_figure(s.compare_records)},
            stem="thinkviz-compare",
            what="comparison",
        ),
        session,
        exported,
        api_name="export_compare_figure",
    )
    chosen.policies.change(
        lambda names: [gr.update(visible=i < max(MIN_COLUMNS, len(names or []))) for i in range(len(columns))],
        chosen.policies,
        columns,
        show_progress="hidden",
        api_visibility="private",
    )
    chosen.policies.change(
        lambda names: kv.shown(names or []),
        chosen.policies,
        list(kv.formats),
        show_progress="hidden",
        api_visibility="private",
    )

    def offer_views(names: list[str] | None, knob_text: str, mode: str):
        """The token views the checked policies offer (:func:`column_view_choices`), keeping ``mode`` if offered."""
        try:
            names = list(names or [])
            own = parse_knobs(knob_text, names)
            choices = column_view_choices([make_policy(name, **knobs_for(name, own)) for name in names])
        except USER_ERRORS:  # a knob half typed: the next change decides
            return gr.skip()
        return gr.update(choices=choices, value=mode if mode in {m for _, m in choices} else "combined")

    for control in (chosen.policies, chosen.knobs):
        control.change(
            offer_views,
            [chosen.policies, chosen.knobs, view_mode],
            view_mode,
            show_progress="hidden",
            api_visibility="private",
        )

    def switch_mode(s: Session, mode: str):
        for channel in s.compare_channels:
            channel.set_mode(mode)
        records = list(s.compare_records.values())
        shared, heads = column_views(mode, list(s.compare_records), records, s.compare_views, s.compare_fidelity)
        heads += [gr.skip()] * (len(headers) - len(heads))
        if s.running or not s.compare_views:
            return [gr.skip(), shared, *([gr.skip()] * len(headers) if s.running else heads)]
        return [
            bus_payload([c.message(v, reset=True) for c, v in zip(s.compare_channels, s.compare_views)]),
            shared,
            *heads,
        ]

    view_mode.change(
        switch_mode, [session, view_mode], [app.bus, legend, *headers], show_progress="hidden", api_visibility="private"
    )

    def run_compare(s: Session, view_mode: str, **values):
        def prepare():
            chat, policy_values, decode_values, format_values, (limit, vary) = split(
                values, panel, chosen, decode, kv, options
            )
            policies, measure_fidelity = chosen.make(policy_values, vary)
            columns_ = [
                Column(policy, fmt)
                for policy, fmt in zip(policies, kv.kv_quants(format_values, [p.name for p in policies]))
            ]
            request = columns_, InputControls.request(chat, limit), decode.settings(decode_values), measure_fidelity
            for channel in s.compare_channels[: len(columns_)]:
                channel.set_mode(view_mode)
            return request

        def shown_columns(request) -> list:
            return [gr.update(visible=i < len(request[0])) for i in range(len(columns))]

        def waiting(request) -> list:
            return [
                WAITING,
                *[gr.skip()] * 4,
                *[gr.skip()] * len(headers),
                *shown_columns(request),
                gr.skip(),
                gr.skip(),
            ]

        def frames(loaded, request, cancel):
            columns_, run_input, settings, measure_fidelity = request
            channels = s.compare_channels[: len(columns_)]
            yield from placed(
                s,
                compare_frames(
                    loaded, columns_, run_input, settings, cancel, channels, measure_fidelity, speed=app.slot.speed
                ),
                len(columns_),
            )

        yield from run_with_model(app.slot, prepare, frames, waiting, s)

    def placed(s: Session, frames, count: int):
        """Each frame's outputs, in the order the Compare and Play events list them."""
        shown = [gr.update(visible=i < count) for i in range(len(columns))]
        shelved = False  # the columns go on the shelf with the first frame: Explore may open them mid-run
        for frame in frames:
            s.compare_records, s.compare_views, s.compare_fidelity = frame.records, frame.views, frame.measured
            source = gr.skip()
            if not shelved:
                s.keep_compare(frame.records.values(), list(frame.records))
                source, shelved = run_picker(s), True
            elif frame.done:
                s.trim()
                source = run_picker(s)
            head = frame.headers + [""] * (len(headers) - len(frame.headers))
            bus, charts = chart_frame(
                frame.bus,
                {MEMORY_ID: frame.figure, FIDELITY_ID: frame.fidelity},
                frame.done,
                s.compare_channels[0].run,  # the run's id (each column's channel has one)
                first=not any(record.events for record in frame.records.values()),
            )
            figure, fidelity = (gr.skip() if chart is None else chart for chart in charts)
            yield [
                frame.status,
                bus,
                figure,
                frame.shown_table,
                source,
                *head,
                *shown,
                frame.legend,
                fidelity,
            ]

    def play_compare(s: Session, view_mode: str, preset: str | None, speed: str):
        def load():
            if not preset:
                raise ControlError("Pick a preset to play its recording.")
            return load_preset_recording(preset)

        def play(recording, cancel):
            count = len(recording.labels)
            channels = s.compare_channels[:count]
            for channel in channels:
                channel.set_mode(view_mode)
            yield from placed(s, playback_frames(recording, SPEEDS.get(speed, 4.0), cancel, channels), count)

        yield from play_recording(load, play, s)

    def connect(explore: ExploreLink) -> None:
        outputs = [status, app.bus, overlay, table, explore.source, *headers, *columns, legend, per_token]
        run.click(
            run_compare,
            [session, view_mode],
            outputs,
            inputs_kwargs=named(panel, chosen, decode, kv, options),
            concurrency_limit=1,
            concurrency_id=MODEL_GROUP,
            api_name="compare",
            show_progress="hidden",
        ).then(explore.refresh, explore.inputs, explore.outputs, show_progress="hidden", api_visibility="private")
        playback.play.click(
            play_compare,
            [session, view_mode, panel.preset, playback.speed],
            outputs,
            concurrency_limit=4,
            concurrency_id=PLAYBACK_GROUP,
            api_name="play_compare",
            show_progress="hidden",
        ).then(explore.refresh, explore.inputs, explore.outputs, show_progress="hidden", api_visibility="private")

    return connect
