"""The Compare tab: 2–6 columns on the same input, streaming together, a memory overlay and the
fidelity table; the same policy may fill several columns with different knobs ("vary").

Frames come from :func:`thinkviz.ui.compare_run.compare_frames` (a live run) and
:func:`thinkviz.ui.compare_run.playback_frames` (a preset's recording, no model); this module lays out
the controls and places what each frame carries.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, fields
from typing import Any
from collections.abc import Callable, Iterator, Mapping, Sequence

import gradio as gr

from ...core.engine import DecodeSettings
from ...core.kvquant import KVQuant
from ...demos.playback import SPEEDS
from ...demos.presets import Preset
from ...demos.record import load_preset_recording
from ...measure.comparison import MAX_COLUMNS, MIN_COLUMNS, Column, preset_policies
from ...measure.requests import RunInput
from ...policies import REFERENCE_POLICY, Policy, make_policy, policy_names
from ...sweep.grid import check_vary, parse_vary, vary_grid
from ...viz.compare_chart import compare_memory_figure
from ...viz.figures import placeholder_figure
from ...viz.legend import view_legend
from ...viz.tokens import TokenData, view_mode_choices
from .. import inputs
from ..chat_controls import InputControls, input_controls, trace_limit
from ..compare_run import FIDELITY_COLUMNS, CompareFrame, check_columns, column_views, compare_frames, playback_frames
from ..controls import ControlError, build_policy, default_view, format_knobs, knobs_for, parse_knobs
from ..wiring import bind
from ..handlers import (
    USER_ERRORS,
    Updates,
    charted,
    figure_file,
    play_recording,
    run_picker,
    run_with_model,
    streamed,
    wire_price,
)
from ..price import Work, price_line
from ..session import COMPARE_TOKENS_IDS, Session
from ..stream import bus_payload, container_html
from ..text import plain_markdown
from ..widgets import (
    CommonControls,
    DecodeControls,
    Group,
    PlaybackControls,
    common_controls,
    decode_controls,
    follow_toggle,
    knob_box,
    kv_format_dropdown,
    named,
    playback_controls,
    preset_knobs,
    residual_slider,
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

    def preset_updates(self, preset: Preset, policies: list[str]) -> Updates:
        """:meth:`preset_values` by component (the measure flag stays)."""
        return dict(zip(self.inputs()[:-1], self.preset_values(preset, policies), strict=True))


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

    def shown(self, names: Sequence[str] | None) -> Updates:
        """Updates showing the dropdowns of the checked policies ``names``."""
        return {box: gr.update(visible=name in (names or [])) for box, name in zip(self.formats, self.policies)}

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


MEMORY_PLACEHOLDER = "Each policy's KV cache appears here"
FIDELITY_PLACEHOLDER = "ΔNLL and KL per token appear here once fidelity is measured"


@dataclass(frozen=True)
class CompareTab:
    """The Compare tab's components, declared once: the app it is in, its controls (by group), its
    buttons and what it shows (a header and a token view per column, up to six)."""

    app: AppContext
    panel: InputControls
    run: gr.Button
    stop: gr.Button
    playback: PlaybackControls
    chosen: PolicySetControls
    kv: ColumnFormats
    options: CompareOptions
    decode: DecodeControls
    status: gr.Markdown
    price: gr.Markdown  # what the comparison the controls describe would take here
    view_mode: gr.Radio
    legend: gr.HTML
    headers: tuple[gr.HTML, ...]
    columns: tuple[gr.Column, ...]
    overlay: gr.Plot
    table: gr.Dataframe
    per_token: gr.Plot
    export_figure: gr.Button
    exported: gr.File

    def run_groups(self) -> tuple[Group, ...]:
        """The groups Compare reads, in the order of its API (after the view mode)."""
        return self.panel, self.chosen, self.decode, self.kv, self.options


@dataclass(frozen=True)
class CompareScreen:
    """What Compare and Play update, frame by frame; the fields' order (the headers and columns in
    turn) is the events' outputs, and so the order an API client receives them in."""

    status: gr.Markdown
    bus: gr.Textbox
    overlay: gr.Plot
    table: gr.Dataframe
    source: gr.Dropdown  # Explore's run picker: the columns are offered there from the first frame
    headers: tuple[gr.HTML, ...]
    columns: tuple[gr.Column, ...]
    legend: gr.HTML
    per_token: gr.Plot

    def outputs(self) -> list:
        parts = [getattr(self, field.name) for field in fields(self)]
        return [c for part in parts for c in (part if isinstance(part, tuple) else [part])]


@dataclass(frozen=True)
class CompareRequest:
    """One comparison, as the controls describe it (validated: a bad value was a toast)."""

    columns: list[Column]
    run_input: RunInput
    settings: DecodeSettings
    measure_fidelity: bool


def layout(app: AppContext) -> CompareTab:
    """Lay out the Compare tab's controls (left) and views (right)."""
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
            price = gr.Markdown("", elem_id="tv-compare-price", elem_classes=["tv-status", "tv-price"])
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
                placeholder_figure(MEMORY_PLACEHOLDER), label="KV-cache memory, all policies", elem_id=MEMORY_ID
            )
            table = gr.Dataframe(
                headers=FIDELITY_COLUMNS,
                label="Fidelity against the full cache",
                interactive=False,
                elem_id="tv-compare-table",
                wrap=True,
            )
            per_token = gr.Plot(
                placeholder_figure(FIDELITY_PLACEHOLDER),
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
    return CompareTab(
        app, panel, run, stop, playback, chosen, kv, options, decode, status, price, view_mode, legend,
        tuple(headers), tuple(columns), overlay, table, per_token, export_fig, exported,
    )  # fmt: skip


# ---- the controls' own events -------------------------------------------------------------------
def visible_columns(columns: Sequence[gr.Column], count: int) -> Updates:
    """The first ``count`` columns shown, the others hidden."""
    return {column: gr.update(visible=i < count) for i, column in enumerate(columns)}


def checked_columns(tab: CompareTab, names: list[str] | None) -> Updates:
    """As many columns as policies are checked (at least the fewest a comparison has)."""
    return visible_columns(tab.columns, max(MIN_COLUMNS, len(names or [])))


def pick_preset(tab: CompareTab, name: str | None) -> Updates:
    """The preset's chat, the policies it compares with its knobs and KV formats, its token limit and
    a view with heat where a column has it."""
    choice, updates = tab.panel.preset_updates(name)
    if choice is None:
        return gr.skip()
    known, formats, left_out = preset_policies(choice.preset)
    if left_out:
        updates[tab.panel.notice] += (
            f"\n\n_Showing {', '.join(known)}; also listed: {plain_markdown(', '.join(left_out))}._"
        )
    return {
        **updates,
        **tab.chosen.preset_updates(choice.preset, known),
        tab.decode.max_new_tokens: choice.preset.max_new_tokens,
        tab.view_mode: "combined" if "combined" in map(default_view, known) else "evicted",
        **tab.kv.by_component(tab.kv.preset_values(choice.preset, known, formats)),
    }


def clear_results(tab: CompareTab, s: Session, mode: str) -> Updates:
    """A new preset: the last comparison's columns, table and charts go (Explore keeps its runs)."""
    if s.running:
        return gr.skip()
    s.compare_views = []
    empty = [c.message(TokenData([]), reset=True) for c in s.compare_channels]
    return {
        tab.app.bus: bus_payload(empty),
        **{header: "" for header in tab.headers},
        tab.table: {"headers": FIDELITY_COLUMNS, "data": []},
        tab.overlay: placeholder_figure(MEMORY_PLACEHOLDER),
        tab.per_token: placeholder_figure(FIDELITY_PLACEHOLDER),
        tab.legend: view_legend(mode, "", None, parts=("keep", "segments", "boxes")),
    }


def offer_preset(tab: CompareTab, name: str | None) -> Updates:
    """Play, where the preset has a recording."""
    return {tab.playback.play: PlaybackControls.offer(name)}


def price_compare(tab: CompareTab, preset: str | None, **values: Any) -> Updates:
    """The price line: how long the comparison the controls describe takes here."""

    def work() -> Work:
        asked = compare_request(tab, values)
        measure = asked.measure_fidelity or asked.run_input.replay
        return Work(asked.columns, asked.run_input, asked.settings, measure, True)

    return {tab.price: price_line(tab.app.slot, work, preset)}


def export_overlay(s: Session) -> str:
    def figures() -> dict[str, Any]:
        return {"KV cache by policy": compare_memory_figure(s.compare_records)}

    return figure_file(bool(s.compare_records), figures, stem="thinkviz-compare", what="comparison")


def offer_views(names: list[str] | None, knob_text: str, mode: str) -> dict:
    """The token views the checked policies offer (:func:`column_view_choices`), keeping ``mode`` if offered."""
    try:
        names = list(names or [])
        own = parse_knobs(knob_text, names)
        choices = column_view_choices([make_policy(name, **knobs_for(name, own)) for name in names])
    except USER_ERRORS:  # a knob half typed: the next change decides
        return gr.skip()
    return gr.update(choices=choices, value=mode if mode in {m for _, m in choices} else "combined")


def switch_mode(tab: CompareTab, s: Session, mode: str) -> Updates:
    """Another token view: the shown columns redrawn in it (running ones redraw on their next frame)."""
    for channel in s.compare_channels:
        channel.set_mode(mode)
    records = list(s.compare_records.values())
    shared, heads = column_views(mode, list(s.compare_records), records, s.compare_views, s.compare_fidelity)
    updates: Updates = {tab.legend: shared}
    if not s.running:
        updates.update(zip(tab.headers, heads))
        if s.compare_views:
            views = zip(s.compare_channels, s.compare_views)
            updates[tab.app.bus] = bus_payload([c.message(v, reset=True) for c, v in views])
    return updates


# ---- a comparison's frames ----------------------------------------------------------------------
def placed(screen: CompareScreen, s: Session, frames: Iterator[CompareFrame], count: int) -> Iterator[Updates]:
    """What each frame updates; the columns go on the session's shelf with the first frame (Explore
    may open them mid-run)."""
    shelved = False
    for frame in frames:
        s.compare_records, s.compare_views, s.compare_fidelity = frame.records, frame.views, frame.measured
        updates: Updates = {screen.status: frame.status, screen.table: frame.shown_table}
        if not shelved:
            s.keep_compare(frame.records.values(), list(frame.records))
            updates[screen.source], shelved = run_picker(s), True
        elif frame.done:
            s.trim()
            updates[screen.source] = run_picker(s)
        head = frame.headers + [""] * (len(screen.headers) - len(frame.headers))
        plots = {screen.overlay: frame.figure, screen.per_token: frame.fidelity}
        first = not any(record.events for record in frame.records.values())
        revision = s.compare_channels[0].run  # the run's id (each column's channel has one)
        updates.update(charted(screen.bus, frame.bus, plots, frame.done, revision, first))
        updates.update(zip(screen.headers, head))
        updates.update(visible_columns(screen.columns, count))
        updates[screen.legend] = frame.legend
        yield updates


def compare_request(tab: CompareTab, values: Mapping[str, Any]) -> CompareRequest:
    """The comparison Compare's values (by API name) describe; a user error where one is bad."""
    policies, measure_fidelity = tab.chosen.make(tab.chosen.of(values), values["vary"])
    formats = tab.kv.kv_quants(tab.kv.of(values), [p.name for p in policies])
    return CompareRequest(
        columns=[Column(policy, fmt) for policy, fmt in zip(policies, formats)],
        run_input=InputControls.request(tab.panel.of(values), values["max_trace_tokens"]),
        settings=tab.decode.settings(tab.decode.of(values)),
        measure_fidelity=measure_fidelity,
    )


def run_compare(tab: CompareTab, screen: CompareScreen, s: Session, view_mode: str, **values: Any) -> Iterator[Updates]:
    def prepare() -> CompareRequest:
        request = compare_request(tab, values)
        for channel in s.compare_channels[: len(request.columns)]:
            channel.set_mode(view_mode)
        return request

    def waiting(asked: CompareRequest, line: str) -> Updates:
        return {screen.status: line, **visible_columns(screen.columns, len(asked.columns))}

    def frames(loaded, asked: CompareRequest, cancel) -> Iterator[Updates]:
        channels = s.compare_channels[: len(asked.columns)]
        run = compare_frames(
            loaded,
            asked.columns,
            asked.run_input,
            asked.settings,
            cancel,
            channels,
            asked.measure_fidelity,
            speed=tab.app.slot.speed,
        )
        yield from placed(screen, s, run, len(asked.columns))

    yield from run_with_model(tab.app.slot, prepare, frames, waiting, s)


def play_compare(
    screen: CompareScreen, s: Session, view_mode: str, preset: str | None, speed: str
) -> Iterator[Updates]:
    def load():
        if not preset:
            raise ControlError("Pick a preset to play its recording.")
        return load_preset_recording(preset)

    def play(recording, cancel) -> Iterator[Updates]:
        count = len(recording.labels)
        channels = s.compare_channels[:count]
        for channel in channels:
            channel.set_mode(view_mode)
        yield from placed(screen, s, playback_frames(recording, SPEEDS.get(speed, 4.0), cancel, channels), count)

    yield from play_recording(load, play, s)


# ---- the wiring ---------------------------------------------------------------------------------
def build(app: AppContext) -> Callable[[ExploreLink], None]:
    """Lay out the Compare tab and wire its events; returns the function that wires Compare and Play
    once the Explore tab exists."""
    tab = layout(app)
    session, chosen, hidden = app.session, tab.chosen, {"show_progress": "hidden", "api_visibility": "private"}
    tab.panel.preset.change(
        bind(pick_preset, tab),
        tab.panel.preset,
        tab.panel.preset_outputs()
        + chosen.inputs()[:-1]
        + [tab.decode.max_new_tokens, tab.view_mode]
        + tab.kv.inputs(),
        **hidden,
    ).then(
        bind(clear_results, tab),
        [session, tab.view_mode],
        [app.bus, *tab.headers, tab.table, tab.overlay, tab.per_token, tab.legend],
        **hidden,
    ).then(bind(offer_preset, tab), tab.panel.preset, tab.playback.play, **hidden)
    work = [tab.panel.preset, *tab.panel.inputs(), *chosen.inputs(), *tab.kv.inputs(), *tab.options.inputs()]
    price_inputs = named(*tab.run_groups())
    wire_price(
        app,
        bind(price_compare, tab),
        [*work, *tab.decode.inputs()],
        [tab.panel.preset],
        tab.price,
        price_inputs,
    )
    tab.stop.click(Session.stop, session, None, queue=False, api_name="stop_compare")
    tab.export_figure.click(export_overlay, session, tab.exported, api_name="export_compare_figure")
    chosen.policies.change(bind(checked_columns, tab), chosen.policies, list(tab.columns), **hidden)
    chosen.policies.change(tab.kv.shown, chosen.policies, list(tab.kv.formats), **hidden)
    for control in (chosen.policies, chosen.knobs):
        control.change(offer_views, [chosen.policies, chosen.knobs, tab.view_mode], tab.view_mode, **hidden)
    tab.view_mode.change(
        bind(switch_mode, tab), [session, tab.view_mode], [app.bus, tab.legend, *tab.headers], **hidden
    )
    return bind(connect, tab)


def connect(tab: CompareTab, explore: ExploreLink) -> None:
    """Wire Compare and Play, whose columns Explore's picker offers (and Explore shows whole once done)."""
    screen = CompareScreen(
        tab.status, tab.app.bus, tab.overlay, tab.table, explore.source, tab.headers, tab.columns, tab.legend,
        tab.per_token,
    )  # fmt: skip
    session, outputs = [tab.app.session, tab.view_mode], screen.outputs()
    run_inputs = named(*tab.run_groups())
    streamed(tab.run, bind(run_compare, tab, screen), session, outputs, explore, "compare", inputs_kwargs=run_inputs)
    play_inputs = [*session, tab.panel.preset, tab.playback.speed]
    streamed(tab.playback.play, bind(play_compare, screen), play_inputs, outputs, explore, "play_compare", True)
