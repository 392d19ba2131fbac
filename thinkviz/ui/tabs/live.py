"""The Live tab: one policy streaming token by token, its memory chart and a projection onto a bigger
model, and (optionally) its fidelity against the full cache, token by token.

Frames come from :func:`thinkviz.ui.live_run.live_frames` (a run on the model) and
:func:`thinkviz.ui.live_run.playback_frames` (a preset's recording, no model); this module lays out
the controls (:func:`layout`, once, into a :class:`LiveTab`) and wires module-level handlers to
them (:func:`build`); a handler returns ``{component: value}`` for what it updates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any
from collections.abc import Callable, Iterator, Mapping

import gradio as gr

from ...core.events import RunRecord
from ...core.faults import RunFault
from ...core.kvquant import KVQuant
from ...core.engine import DecodeSettings
from ...demos.playback import SPEEDS
from ...demos.record import load_preset_recording
from ...measure.comparison import Column
from ...measure.requests import RunInput
from ...memory import CARDS_GB, Projection
from ...models.loading import LoadedModel
from ...policies import Policy, make_policy
from ...viz.figures import placeholder_figure
from ...viz.memory_chart import memory_figure
from ...viz.legend import view_legend
from ...viz.tokens import view_mode_choices
from .. import inputs
from ..chat_controls import InputControls, LiveOptions, input_controls, live_options, thinking_switch
from ..controls import ControlError, default_view
from ..inputs import first_preset
from ..model_panel import model_settings
from ..wiring import bind
from ..handlers import (
    MODEL_GROUP,
    MODEL_LIMIT,
    USER_ERRORS,
    Updates,
    charted,
    figure_file,
    play_recording,
    recording_file,
    run_picker,
    run_with_model,
    streamed,
    shown,
    wire_price,
)
from ..live_run import LiveFrame, live_frames, playback_frames
from ..model_slot import ModelSlot
from ..price import Work, price_line
from ..scripted import run_summary, script_request
from ..session import LIVE_TOKENS_ID, Session
from ..stream import TokenChannel, bus_payload, container_html
from ..throttle import FramePacer
from ..widgets import (
    DecodeControls,
    Group,
    KVControls,
    PlaybackControls,
    PolicyControls,
    decode_controls,
    export_controls,
    follow_toggle,
    kv_controls,
    named,
    playback_controls,
    policy_controls,
    preset_kv,
)
from . import AppContext, ExploreLink

DEFAULT_POLICY = "h2o"
MEMORY_ID, FIDELITY_ID = "tv-live-memory", "tv-live-fidelity"  # the charts a run redraws in place
FIDELITY_PLACEHOLDER = "ΔNLL and KL per token appear here with 'Measure against the full cache'"


def view_choices(policy: Policy) -> list[tuple[str, str]]:
    """The token views a run of ``policy`` can show: ``mass`` for one that fits attention biases, the
    prediction modes for one that predicts importance."""
    return view_mode_choices(policy.predicts_importance, policy.fits_bias)


@dataclass(frozen=True)
class MemoryView:
    """What the memory chart shows besides the cache: the kept tokens priced on a bigger model
    (``None``: not), and whether the process's memory and the weights get a panel."""

    projection: Projection | None = None
    show_device: bool = False

    @staticmethod
    def of(
        project_onto: str | None, card_gib: Any, process_memory: bool, loaded: LoadedModel | None = None
    ) -> MemoryView:
        """The view :class:`ProjectionControls` describe (its values by API name), "the loaded model"
        priced on ``loaded``, the model the app holds when the chart is drawn."""
        return MemoryView(inputs.projection(project_onto, card_gib, loaded), bool(process_memory))

    def figure(self, record: RunRecord, device_stats: dict[int, dict] | None) -> Any:
        return memory_figure(
            record, projection=self.projection, show_device=self.show_device, device_stats=device_stats
        )


@dataclass
class ProjectionControls(Group):
    """Which bigger model and card the memory chart prices the kept tokens on, and whether it also
    shows the process's memory and the weights (off by default: they dwarf a small model's cache)."""

    project_onto: gr.Dropdown
    card_gib: gr.Radio
    process_memory: gr.Checkbox

    def inputs(self) -> list:
        return [self.project_onto, self.card_gib, self.process_memory]


def projection_controls() -> ProjectionControls:
    with gr.Row():
        target = gr.Dropdown(
            list(inputs.PROJECTION_TARGETS),
            value=inputs.DEFAULT_TARGET,
            label="Project memory onto",
            info="price the kept tokens on a bigger model, or on the loaded model's own shape",
        )
        card = gr.Radio(list(CARDS_GB), value=inputs.DEFAULT_CARD, label="Card (GiB VRAM)", elem_id="tv-live-card")
    device = gr.Checkbox(
        value=False,
        label="Also chart process memory and the weights",
        elem_id="tv-live-device",
        info="in a panel of their own: they are far larger than this model's cache",
    )
    return ProjectionControls(target, card, device)


@dataclass(frozen=True)
class ScriptInputs:
    """``/run_policy``'s own inputs, hidden from the page: a policy by name, a JSON object of knobs and
    a preset to take the chat from; its summary; the button its event hangs on."""

    policy: gr.Textbox
    knobs: gr.Textbox
    preset: gr.Textbox
    summary: gr.JSON
    button: gr.Button

    def named(self) -> dict[str, Any]:
        return {"policy": self.policy, "knobs": self.knobs, "preset": self.preset}


def script_inputs() -> ScriptInputs:
    return ScriptInputs(
        gr.Textbox(DEFAULT_POLICY, label="Policy name", visible=False),
        gr.Textbox("{}", label="Knobs (JSON object by name)", visible=False),
        gr.Textbox("", label="Preset name (empty: run the chat given)", visible=False),
        gr.JSON(label="Run summary", visible=False),
        gr.Button(visible=False),
    )


@dataclass(frozen=True)
class LiveTab:
    """The Live tab's components, declared once: the app it is in, its controls (by group), its
    buttons and what it shows."""

    app: AppContext
    panel: InputControls
    generate: gr.Button
    stop: gr.Button
    playback: PlaybackControls
    controls: PolicyControls
    kv: KVControls
    options: LiveOptions
    decode: DecodeControls
    projection: ProjectionControls
    status: gr.Markdown
    price: gr.Markdown  # what the run the controls describe would take here
    stats: gr.HTML
    view_mode: gr.Radio
    legend: gr.HTML
    memory: gr.Plot
    fidelity: gr.Plot
    export_run: gr.Button
    export_figure: gr.Button
    exported: gr.File
    script: ScriptInputs

    def run_groups(self) -> tuple[Group, ...]:
        """The groups Generate reads, in the order of its API (after the view mode)."""
        return self.panel, self.controls, self.decode, self.projection, self.kv, self.options


@dataclass(frozen=True)
class LiveScreen:
    """What Generate and Play update, frame by frame; the fields' order is the events' outputs (and
    so the order an API client receives them in)."""

    status: gr.Markdown
    bus: gr.Textbox
    memory: gr.Plot
    stats: gr.HTML
    source: gr.Dropdown  # Explore's run picker: a run is offered there from its first frame
    legend: gr.HTML
    fidelity: gr.Plot

    def outputs(self) -> list:
        return [getattr(self, field.name) for field in fields(self)]


@dataclass(frozen=True)
class LiveRequest:
    """One Live run, as the controls describe it (validated: a bad value was a toast)."""

    policy: Policy
    run_input: RunInput
    settings: DecodeSettings
    memory: MemoryView
    kv_quant: KVQuant
    measure: bool


def layout(app: AppContext) -> LiveTab:
    """Lay out the Live tab's controls (left) and views (right)."""
    with gr.Row(elem_classes="tv-layout"):
        with gr.Column(scale=2, min_width=320, elem_classes="tv-controls"):
            panel = input_controls(app.presets, "live", app.slot)
            with gr.Row(elem_classes="tv-bar"):
                generate = gr.Button("Generate", variant="primary", elem_id="tv-live-run")
                stop = gr.Button("Stop", variant="stop", elem_id="tv-live-stop")
                playback = playback_controls("live")
            controls = policy_controls(DEFAULT_POLICY)
            kv = kv_controls("live")
            options = live_options()
            decode = decode_controls("live")
            projection = projection_controls()
            model_lines = [app.model_status, app.model_ready]
            model_settings(app.slot, app.model, app.quantization, model_lines, app.model_loading)
        with gr.Column(scale=3, min_width=420, elem_classes="tv-outputs"):
            status = gr.Markdown(
                "Press ▶ Play recording to watch the preset, or Generate to run it live; or pick another preset "
                "or type a question.",
                elem_id="tv-live-status",
                elem_classes="tv-status",
            )
            price = gr.Markdown("", elem_id="tv-live-price", elem_classes=["tv-status", "tv-price"])
            stats = gr.HTML("", elem_id="tv-live-stats")
            with gr.Row(equal_height=True):
                view_mode = gr.Radio(
                    view_choices(make_policy(DEFAULT_POLICY)),
                    value=default_view(DEFAULT_POLICY),
                    label="Token view",
                    elem_id="tv-live-mode",
                    scale=4,
                )
                follow_toggle("live")
            legend = gr.HTML(view_legend(default_view(DEFAULT_POLICY), DEFAULT_POLICY, None), elem_id="tv-live-legend")
            with gr.Row(elem_classes="tv-stage"):
                with gr.Column(elem_classes="tv-stage-tokens", min_width=320):
                    gr.HTML(container_html(LIVE_TOKENS_ID, follow="tv-live-follow"))
                with gr.Column(elem_classes="tv-stage-chart", min_width=320):
                    memory = gr.Plot(
                        placeholder_figure("The KV cache's size appears here while a run streams"),
                        label="KV-cache memory",
                        elem_id=MEMORY_ID,
                    )
            fidelity = gr.Plot(
                placeholder_figure(FIDELITY_PLACEHOLDER),
                elem_id=FIDELITY_ID,
                label="Per-token fidelity against the full cache",
            )
            export_run, export_fig, exported = export_controls("live")
    return LiveTab(
        app, panel, generate, stop, playback, controls, kv, options, decode, projection, status, price, stats,
        view_mode, legend, memory, fidelity, export_run, export_fig, exported, script_inputs(),
    )  # fmt: skip


# ---- the controls' own events -------------------------------------------------------------------
def view_for(policy: Policy, mode: str | None = None) -> dict:
    """The view modes ``policy`` offers (:func:`view_choices`), showing ``mode`` while it is one of them,
    else the policy's default view."""
    choices = view_choices(policy)
    return gr.update(choices=choices, value=mode if mode in {m for _, m in choices} else default_view(policy.name))


def policy_views(name: str) -> dict:
    """The view modes once a policy is chosen by hand."""
    return view_for(make_policy(name))


def knob_views(controls: PolicyControls, mode: str, *values: Any) -> dict:
    """The view modes once a knob changed by hand (``tam``'s compaction decides whether it has a mass)."""
    try:
        return view_for(controls.make(values), mode)
    except USER_ERRORS:  # a knob half typed: the next change decides
        return gr.skip()


def pick_preset(tab: LiveTab, name: str | None) -> Updates:
    """The preset's chat, policy, knobs, KV format, token limit and view."""
    choice, chat = tab.panel.preset_updates(name)
    if choice is None:
        return gr.skip()
    preset = choice.preset
    return {
        **chat,
        **tab.controls.by_component(tab.controls.preset_values(preset.policy, preset.params)),
        **tab.kv.by_component(preset_kv(preset)),
        tab.decode.max_new_tokens: preset.max_new_tokens,
        tab.view_mode: view_for(make_policy(preset.policy, **preset.params)),
    }


def offer_preset(tab: LiveTab, name: str | None) -> Updates:
    """Play, where the preset has a recording."""
    return {tab.playback.play: PlaybackControls.offer(name)}


def price_live(tab: LiveTab, preset: str | None, **values: Any) -> Updates:
    """The price line: how long the run the controls describe takes here."""

    def work() -> Work:
        asked = live_request(tab, values)
        return Work([Column(asked.policy, asked.kv_quant)], asked.run_input, asked.settings, asked.measure, False)

    return {tab.price: price_line(tab.app.slot, work, preset)}


def shown_legend(s: Session, mode: str, chosen: str) -> str:
    """The legend of what the view shows: the last run (its policy), else the chosen policy."""
    if s.live_record is None:
        return view_legend(mode, chosen, None)
    return view_legend(mode, str(s.live_record.meta.get("policy")), s.live_view)


def switch_mode(tab: LiveTab, s: Session, mode: str, chosen: str) -> Updates:
    """Another token view: the shown run redrawn in it (a running one redraws on its next frame)."""
    s.live_channel.set_mode(mode)
    legend = {tab.legend: shown_legend(s, mode, chosen)}
    if s.running or s.live_view is None:
        return legend
    return {tab.app.bus: bus_payload(s.live_channel.message(s.live_view, reset=True)), **legend}


def memory_chart(slot: ModelSlot, s: Session, project_onto: str | None, card_gib: Any, process_memory: bool) -> Any:
    """The last run's memory chart, on the projection and panels chosen."""
    view = MemoryView.of(project_onto, card_gib, process_memory, slot.loaded)
    return view.figure(s.live_record, s.live_device_stats)


def reproject(slot: ModelSlot, s: Session, project_onto: str | None, card_gib: Any, process_memory: bool) -> Any:
    if s.live_record is None or s.running:
        return gr.skip()
    return shown(memory_chart, slot, s, project_onto, card_gib, process_memory)


def export_memory_figure(slot: ModelSlot, s: Session, **values: Any) -> str:
    def figures() -> dict[str, Any]:
        return {"KV-cache memory": memory_chart(slot, s, **values)}

    return figure_file(s.live_record is not None, figures, stem="thinkviz-memory")


def export_run(s: Session) -> str:
    return recording_file(s.live_record)


# ---- a run's frames -----------------------------------------------------------------------------
def placed(screen: LiveScreen, s: Session, frames: Iterator[LiveFrame], memory: MemoryView) -> Iterator[Updates]:
    """What each frame updates; the run goes on the session's shelf with its first frame (Explore
    may open it mid-run)."""
    frame, sent, label = None, None, None
    try:
        for frame in frames:
            s.live_record, s.live_view, s.live_device_stats = frame.record, frame.view, frame.device_stats
            updates: Updates = {screen.status: frame.status, screen.stats: frame.stats}
            if label is None:
                label = s.keep_live(frame.record)
                updates[screen.source] = run_picker(s, label)
            elif frame.done:
                s.trim()
                updates[screen.source] = run_picker(s)
            plots = {screen.memory: frame.figure, screen.fidelity: frame.fidelity}
            first = not frame.record.events
            updates.update(charted(screen.bus, frame.bus, plots, frame.done, s.live_channel.run, first))
            if frame.legend != sent:
                updates[screen.legend] = sent = frame.legend
            yield updates
    except RunFault as fault:  # the chart up to the failure stays: an out-of-memory shows where it hit
        if frame is not None:
            yield {screen.status: f"Stopped: {fault}", screen.memory: memory.figure(frame.record, frame.device_stats)}
        raise


def live_request(tab: LiveTab, values: Mapping[str, Any]) -> LiveRequest:
    """The run Generate's values (by API name) describe; a user error where one is bad."""
    return LiveRequest(
        policy=tab.controls.make(tab.controls.of(values)),
        run_input=InputControls.request(tab.panel.of(values), values["max_trace_tokens"], values["enable_thinking"]),
        settings=tab.decode.settings(tab.decode.of(values)),
        memory=MemoryView.of(*tab.projection.of(values)),
        kv_quant=KVControls.make(tab.kv.of(values)),
        measure=bool(values["measure_fidelity"]),
    )


def run_live(tab: LiveTab, screen: LiveScreen, s: Session, view_mode: str, **values: Any) -> Iterator[Updates]:
    def prepare() -> LiveRequest:
        request = live_request(tab, values)
        s.live_channel.set_mode(view_mode)
        return request

    def frames(loaded, asked: LiveRequest, cancel) -> Iterator[Updates]:
        # the view asked for, "the loaded model" priced on the model that runs
        projection = inputs.projection(values["project_onto"], values["card_gib"], loaded)
        memory = replace(asked.memory, projection=projection)
        run = live_frames(
            loaded,
            asked.policy,
            asked.run_input,
            asked.settings,
            cancel,
            s.live_channel,
            memory.projection,
            kv_quant=asked.kv_quant,
            show_device=memory.show_device,
            measure=asked.measure,
            speed=tab.app.slot.speed,
        )
        yield from placed(screen, s, run, memory)

    yield from run_with_model(tab.app.slot, prepare, frames, lambda _, line: {screen.status: line}, s)


def play_live(
    screen: LiveScreen, slot: ModelSlot, s: Session, view_mode: str, preset: str | None, **values: Any
) -> Iterator[Updates]:
    memory = MemoryView.of(values["project_onto"], values["card_gib"], values["process_memory"], slot.loaded)

    def load():
        if not preset:
            raise ControlError("Pick a preset to play its recording.")
        return load_preset_recording(preset)

    def play(recording, cancel) -> Iterator[Updates]:
        s.live_channel.set_mode(view_mode)
        speed = SPEEDS.get(values["speed"], 4.0)
        run = playback_frames(
            recording, speed, cancel, s.live_channel, memory.projection, show_device=memory.show_device
        )
        yield from placed(screen, s, run, memory)

    yield from play_recording(load, play, s)


def run_policy(tab: LiveTab, s: Session, policy: str, knobs: str, preset: str, **values: Any) -> Iterator[Updates]:
    """Run `policy` with `knobs`, a JSON object by knob name (budget, interval, protect_system,
    protect_question and the policy's own; `python -m thinkviz policies` lists them), on the
    chat given, or on `preset`'s chat, trace and new-token limit (its policy and knobs unless
    `policy` / `knobs` say otherwise).  Returns the run's summary and its recording (a zip)."""

    def prepare() -> LiveRequest:
        asked = script_request(policy, knobs, preset, values, values["max_new_tokens"])
        settings = tab.decode.settings(tab.decode.of({**values, "max_new_tokens": asked.max_new_tokens}))
        return LiveRequest(asked.policy, asked.run_input, settings, MemoryView(), KVQuant(), False)

    def frames(loaded, asked: LiveRequest, cancel) -> Iterator[Updates]:
        once = FramePacer(math.inf)  # the first frame and the last: nobody watches this run
        channel = TokenChannel(LIVE_TOKENS_ID)
        for frame in live_frames(
            loaded, asked.policy, asked.run_input, asked.settings, cancel, channel, pacer=once, figure_pacer=once
        ):
            s.live_record, s.live_view, s.live_device_stats = frame.record, frame.view, frame.device_stats
        summary = run_summary(s.keep_live(frame.record), frame)
        yield {tab.script.summary: summary, tab.exported: recording_file(frame.record)}

    yield from run_with_model(tab.app.slot, prepare, frames, lambda _, line: {tab.script.summary: {"status": line}}, s)


# ---- the wiring ---------------------------------------------------------------------------------
def build(app: AppContext) -> Callable[[ExploreLink], None]:
    """Lay out the Live tab and wire its events; returns the function that wires Generate and Play
    once the Explore tab exists."""
    tab = layout(app)
    session, controls, hidden = app.session, tab.controls, {"show_progress": "hidden", "api_visibility": "private"}
    legend_inputs = [session, tab.view_mode, controls.policy]
    tab.panel.preset.change(
        bind(pick_preset, tab),
        tab.panel.preset,
        tab.panel.preset_outputs() + controls.inputs() + tab.kv.inputs() + [tab.decode.max_new_tokens, tab.view_mode],
        **hidden,
    ).then(shown_legend, legend_inputs, tab.legend, **hidden).then(
        bind(offer_preset, tab), tab.panel.preset, tab.playback.play, **hidden
    )
    work = [tab.panel.preset, *tab.panel.inputs(), *controls.inputs(), *tab.kv.inputs(), *tab.options.inputs()]
    price_inputs = named(*tab.run_groups())
    wire_price(app, bind(price_live, tab), [*work, *tab.decode.inputs()], [tab.panel.preset], tab.price, price_inputs)
    loaded = [app.model_ready.change, app.demo.load]
    gr.on(loaded, bind(thinking_switch, app.slot), None, tab.options.enable_thinking, trigger_mode="multiple", **hidden)
    app.demo.load(bind(first_preset, app.presets), None, tab.panel.preset, **hidden)  # a lesson one click away
    controls.policy.input(policy_views, controls.policy, tab.view_mode, **hidden).then(
        shown_legend, legend_inputs, tab.legend, **hidden
    )
    for slot in controls.slots:
        slot.input(bind(knob_views, controls), [tab.view_mode, *controls.inputs()], tab.view_mode, **hidden)
    tab.view_mode.change(bind(switch_mode, tab), legend_inputs, [app.bus, tab.legend], **hidden)
    for control in tab.projection.inputs():
        control.change(bind(reproject, app.slot), [session, *tab.projection.inputs()], tab.memory, **hidden)
    tab.stop.click(Session.stop, session, None, queue=False, api_name="stop")
    tab.export_run.click(export_run, session, tab.exported, api_name="export_recording")
    tab.export_figure.click(
        bind(export_memory_figure, app.slot),
        [session],
        tab.exported,
        inputs_kwargs=tab.projection.named(),
        api_name="export_figure",
    )
    tab.script.button.click(
        bind(run_policy, tab),
        [session],
        [tab.script.summary, tab.exported],
        inputs_kwargs={**tab.script.named(), **named(tab.panel, tab.decode)},
        concurrency_limit=MODEL_LIMIT,
        concurrency_id=MODEL_GROUP,
        api_name="run_policy",
        show_progress="hidden",
    )
    if controls.slots:
        app.demo.load(bind(controls.updates, DEFAULT_POLICY), None, controls.slots, **hidden)
    return bind(connect, tab)


def connect(tab: LiveTab, explore: ExploreLink) -> None:
    """Wire Generate and Play, whose runs Explore's picker offers (and Explore shows whole once done)."""
    screen = LiveScreen(tab.status, tab.app.bus, tab.memory, tab.stats, explore.source, tab.legend, tab.fidelity)
    session = [tab.app.session, tab.view_mode]
    outputs = screen.outputs()
    run_inputs = named(*tab.run_groups())
    streamed(tab.generate, bind(run_live, tab, screen), session, outputs, explore, "generate", inputs_kwargs=run_inputs)
    play_inputs = named(tab.playback, tab.projection)
    play = bind(play_live, screen, tab.app.slot)
    streamed(tab.playback.play, play, [*session, tab.panel.preset], outputs, explore, "play", True, play_inputs)
