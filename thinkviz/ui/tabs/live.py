"""The Live tab: one policy streaming token by token, its memory chart and a projection onto a bigger
model, and (optionally) its fidelity against the full cache, token by token.

Frames come from :func:`thinkviz.ui.live_run.live_frames` (a run on the model) and
:func:`thinkviz.ui.live_run.playback_frames` (a preset's recording, no model); this module lays out the
controls and places what each frame carries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

import gradio as gr

from ...core.faults import RunFault
from ...memory import CARDS_GB, Projection
from ...demos.playback import SPEEDS
from ...policies import Policy, make_policy
from ...viz.figures import placeholder_figure
from ...viz.memory_chart import memory_figure
from ...viz.legend import view_legend
from ...viz.tokens import view_mode_choices
from .. import inputs
from ..controls import ControlError, default_view
from ...demos.record import load_preset_recording
from ..price import preset_estimate
from ..handlers import (
    MODEL_GROUP,
    PLAYBACK_GROUP,
    USER_ERRORS,
    WAITING,
    figure_file,
    play_recording,
    recording_file,
    run_picker,
    run_with_model,
    shown,
)
from ..live_run import live_frames, playback_frames
from ..scripted import run_summary, script_request
from ..session import LIVE_TOKENS_ID, Session
from ..stream import TokenChannel, bus_payload, chart_frame, container_html
from ..throttle import FramePacer
from ..widgets import (
    Group,
    InputControls,
    KVControls,
    PlaybackControls,
    decode_controls,
    export_controls,
    follow_toggle,
    input_controls,
    kv_controls,
    model_settings,
    named,
    playback_controls,
    policy_controls,
    preset_kv,
    preset_values,
    split,
    trace_limit,
)
from . import AppContext, ExploreLink

DEFAULT_POLICY = "h2o"
MEMORY_ID, FIDELITY_ID = "tv-live-memory", "tv-live-fidelity"  # the charts a run redraws in place


def view_choices(policy: Policy) -> list[tuple[str, str]]:
    """The token views a run of ``policy`` can show: ``mass`` for one that fits attention biases, the
    prediction modes for one that predicts importance."""
    return view_mode_choices(policy.predicts_importance, policy.fits_bias)


@dataclass
class ProjectionControls(Group):
    """Which bigger model and card the memory chart prices the kept tokens on, and whether it also
    shows the process's memory and the weights (off by default: they dwarf a small model's cache)."""

    project_onto: gr.Dropdown
    card_gib: gr.Radio
    process_memory: gr.Checkbox

    def inputs(self) -> list:
        return [self.project_onto, self.card_gib, self.process_memory]

    @staticmethod
    def projection(values: Sequence[Any]) -> Projection | None:
        return inputs.projection(*values[:2])

    @staticmethod
    def show_device(values: Sequence[Any]) -> bool:
        return bool(values[2])


def projection_controls() -> ProjectionControls:
    with gr.Row():
        target = gr.Dropdown(
            list(inputs.PROJECTION_TARGETS),
            value=inputs.DEFAULT_TARGET,
            label="Project memory onto",
            info="price the kept tokens on a bigger model",
        )
        card = gr.Radio(list(CARDS_GB), value=inputs.DEFAULT_CARD, label="Card (GiB VRAM)", elem_id="tv-live-card")
    device = gr.Checkbox(
        value=False,
        label="Also chart process memory and the weights",
        elem_id="tv-live-device",
        info="in a panel of their own: they are far larger than this model's cache",
    )
    return ProjectionControls(target, card, device)


@dataclass
class LiveOptions(Group):
    """What Live adds after the shared groups (at the end of its API): the trace tokens to replay and
    whether to measure fidelity against the full cache."""

    max_trace_tokens: gr.Slider
    measure_fidelity: gr.Checkbox

    def inputs(self) -> list:
        return [self.max_trace_tokens, self.measure_fidelity]


def live_options() -> LiveOptions:
    limit = trace_limit("live")
    measure = gr.Checkbox(
        value=False,
        label="Measure against the full cache",
        elem_id="tv-live-measure",
        info="ΔNLL and KL per token: a replay runs in lockstep with the full cache; "
        "a generation is teacher-forced through both afterwards",
    )
    return LiveOptions(limit, measure)


FIDELITY_PLACEHOLDER = "ΔNLL and KL per token appear here with 'Measure against the full cache'"


def build(app: AppContext) -> Callable[[ExploreLink], None]:
    """Lay out the Live tab; returns the function that wires Generate once the Explore tab exists."""
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
            model_settings(app.slot, app.model, app.quantization, app.model_status, app.model_loading)
        with gr.Column(scale=3, min_width=420, elem_classes="tv-outputs"):
            status = gr.Markdown(
                "Pick a preset or type a question, then Generate.", elem_id="tv-live-status", elem_classes="tv-status"
            )
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
    session = app.session

    def pick_preset(name: str | None) -> list:
        choice, values = preset_values(name)
        if choice is None:
            return values + [gr.skip()] * (len(controls.inputs()) + len(kv.inputs()) + 2)
        preset = choice.preset
        return values + [
            *controls.preset_values(preset.policy, preset.params),
            *preset_kv(preset),
            preset.max_new_tokens,
            view_for(make_policy(preset.policy, **preset.params)),
        ]

    def view_for(policy: Policy, mode: str | None = None):
        """The view modes ``policy`` offers (:func:`view_choices`), showing ``mode`` while it is one of them,
        else the policy's default view."""
        choices = view_choices(policy)
        return gr.update(choices=choices, value=mode if mode in {m for _, m in choices} else default_view(policy.name))

    def knob_views(mode: str, *values):
        """The view modes once a knob changed by hand (``tam``'s compaction decides whether it has a mass)."""
        try:
            return view_for(controls.make(values), mode)
        except USER_ERRORS:  # a knob half typed: the next change decides
            return gr.skip()

    def shown_legend(s: Session, mode: str, chosen: str) -> str:
        """The legend of what the view shows: the last run (its policy), else the chosen policy."""
        if s.live_record is None:
            return view_legend(mode, chosen, None)
        return view_legend(mode, str(s.live_record.meta.get("policy")), s.live_view)

    legend_inputs = [session, view_mode, controls.policy]
    panel.preset.change(
        pick_preset,
        panel.preset,
        panel.preset_outputs() + controls.inputs() + kv.inputs() + [decode.max_new_tokens, view_mode],
        show_progress="hidden",
        api_visibility="private",
    ).then(shown_legend, legend_inputs, legend, show_progress="hidden", api_visibility="private").then(
        lambda name, measure: [
            PlaybackControls.offer(name),
            preset_estimate(app.slot, name, "live", measure) or gr.skip(),
        ],
        [panel.preset, options.measure_fidelity],
        [playback.play, status],
        show_progress="hidden",
        api_visibility="private",
    )
    controls.policy.input(
        lambda name: view_for(make_policy(name)),
        controls.policy,
        view_mode,
        show_progress="hidden",
        api_visibility="private",
    ).then(shown_legend, legend_inputs, legend, show_progress="hidden", api_visibility="private")
    for slot in controls.slots:
        slot.input(
            knob_views, [view_mode, *controls.inputs()], view_mode, show_progress="hidden", api_visibility="private"
        )

    def switch_mode(s: Session, mode: str, chosen: str):
        s.live_channel.set_mode(mode)
        if s.running or s.live_view is None:
            return gr.skip(), shown_legend(s, mode, chosen)  # a running generator resets the view on its next frame
        return bus_payload(s.live_channel.message(s.live_view, reset=True)), shown_legend(s, mode, chosen)

    view_mode.change(switch_mode, legend_inputs, [app.bus, legend], show_progress="hidden", api_visibility="private")

    def figure_for(s: Session, *projection_values):
        return memory_figure(
            s.live_record,
            projection=projection.projection(projection_values),
            show_device=projection.show_device(projection_values),
            device_stats=s.live_device_stats,
        )

    def reproject(s: Session, *projection_values):
        if s.live_record is None or s.running:
            return gr.skip()
        return shown(figure_for, s, *projection_values)

    for control in projection.inputs():
        control.change(
            reproject, [session, *projection.inputs()], memory, show_progress="hidden", api_visibility="private"
        )

    stop.click(Session.stop, session, None, queue=False, api_name="stop")
    export_run.click(lambda s: recording_file(s.live_record), session, exported, api_name="export_recording")
    export_fig.click(
        lambda s, **values: figure_file(
            s.live_record is not None,
            lambda: {"KV-cache memory": figure_for(s, *split(values, projection)[0])},
            stem="thinkviz-memory",
        ),
        [session],
        exported,
        inputs_kwargs=projection.named(),
        api_name="export_figure",
    )

    def placed(s: Session, frames, memory_projection, show_device):
        """Each frame's outputs, in the order the Generate and Play events list them."""
        frame, sent, label = None, None, None
        try:
            for frame in frames:
                s.live_record, s.live_view, s.live_device_stats = frame.record, frame.view, frame.device_stats
                source = gr.skip()
                if label is None:  # on the shelf from its first frame: Explore may open it mid-run
                    label = s.keep_live(frame.record)
                    source = run_picker(s, label)
                elif frame.done:
                    s.trim()
                    source = run_picker(s)
                bus, charts = chart_frame(
                    frame.bus,
                    {MEMORY_ID: frame.figure, FIDELITY_ID: frame.fidelity},
                    frame.done,
                    s.live_channel.run,
                    first=not frame.record.events,
                )
                figure, curve = (gr.skip() if chart is None else chart for chart in charts)
                legend_now, sent = (gr.skip() if frame.legend == sent else frame.legend), frame.legend
                yield [frame.status, bus, figure, frame.stats, source, legend_now, curve]
        except RunFault as fault:  # the chart up to the failure stays: an out-of-memory shows where it hit
            if frame is not None:
                figure = memory_figure(
                    frame.record, projection=memory_projection, device_stats=frame.device_stats, show_device=show_device
                )
                yield [f"Stopped: {fault}", gr.skip(), figure, gr.skip(), gr.skip(), gr.skip(), gr.skip()]
            raise

    def run_live(s: Session, view_mode: str, **values):
        def prepare():
            chat, policy_values, decode_values, projection_values, kv_values, (limit, measure) = split(
                values, panel, controls, decode, projection, kv, options
            )
            request = (
                controls.make(policy_values),
                InputControls.request(chat, limit),
                decode.settings(decode_values),
                projection.projection(projection_values),
                projection.show_device(projection_values),
                KVControls.make(kv_values),
                bool(measure),
            )
            s.live_channel.set_mode(view_mode)
            return request

        def frames(loaded, request, cancel):
            policy, run_input, settings, memory_projection, show_device, kv_quant, measure = request
            yield from placed(
                s,
                live_frames(
                    loaded,
                    policy,
                    run_input,
                    settings,
                    cancel,
                    s.live_channel,
                    memory_projection,
                    kv_quant=kv_quant,
                    show_device=show_device,
                    measure=measure,
                    speed=app.slot.speed,
                ),
                memory_projection,
                show_device,
            )

        yield from run_with_model(app.slot, prepare, frames, lambda _: [WAITING, *[gr.skip()] * 6], s)

    def play_live(s: Session, view_mode: str, preset: str | None, **values):
        (speed,), projection_values = split(values, playback, projection)
        memory_projection = projection.projection(projection_values)
        show_device = projection.show_device(projection_values)

        def load():
            if not preset:
                raise ControlError("Pick a preset to play its recording.")
            return load_preset_recording(preset)

        def play(recording, cancel):
            s.live_channel.set_mode(view_mode)
            yield from placed(
                s,
                playback_frames(
                    recording,
                    SPEEDS.get(speed, 4.0),
                    cancel,
                    s.live_channel,
                    memory_projection,
                    show_device=show_device,
                ),
                memory_projection,
                show_device,
            )

        yield from play_recording(load, play, s)

    # /run_policy: a policy by name and a JSON object of knobs, for scripts (no controls in the page)
    by_name = {
        "policy": gr.Textbox(DEFAULT_POLICY, label="Policy name", visible=False),
        "knobs": gr.Textbox("{}", label="Knobs (JSON object by name)", visible=False),
        "preset": gr.Textbox("", label="Preset name (empty: run the chat given)", visible=False),
    }
    script_summary = gr.JSON(label="Run summary", visible=False)

    def run_policy(s: Session, policy: str, knobs: str, preset: str, **values):
        """Run `policy` with `knobs`, a JSON object by knob name (budget, interval, protect_system,
        protect_question and the policy's own; `python -m thinkviz policies` lists them), on the
        chat given, or on `preset`'s chat, trace and new-token limit (its policy and knobs unless
        `policy` / `knobs` say otherwise).  Returns the run's summary and its recording (a zip)."""

        def prepare():
            chat, decode_values = split(values, panel, decode)
            asked = script_request(policy, knobs, preset, chat, decode_values[0])
            return (
                asked.policy,
                InputControls.request(asked.chat),
                decode.settings((asked.max_new_tokens, *decode_values[1:])),
            )

        def frames(loaded, request, cancel):
            policy_object, run_input, settings = request
            once = FramePacer(math.inf)  # the first frame and the last: nobody watches this run
            for frame in live_frames(
                loaded,
                policy_object,
                run_input,
                settings,
                cancel,
                TokenChannel(LIVE_TOKENS_ID),
                pacer=once,
                figure_pacer=once,
            ):
                s.live_record, s.live_view, s.live_device_stats = frame.record, frame.view, frame.device_stats
            yield [run_summary(s.keep_live(frame.record), frame), recording_file(frame.record)]

        yield from run_with_model(app.slot, prepare, frames, lambda _: [gr.skip(), gr.skip()], s)

    gr.Button(visible=False).click(
        run_policy,
        [session],
        [script_summary, exported],
        inputs_kwargs={**by_name, **named(panel, decode)},
        concurrency_limit=1,
        concurrency_id=MODEL_GROUP,
        api_name="run_policy",
        show_progress="hidden",
    )

    if controls.slots:
        app.demo.load(
            lambda: controls.updates(DEFAULT_POLICY),
            None,
            controls.slots,
            show_progress="hidden",
            api_visibility="private",
        )

    def connect(explore: ExploreLink) -> None:
        outputs = [status, app.bus, memory, stats, explore.source, legend, fidelity]
        generate.click(
            run_live,
            [session, view_mode],
            outputs,
            inputs_kwargs=named(panel, controls, decode, projection, kv, options),
            concurrency_limit=1,
            concurrency_id=MODEL_GROUP,
            api_name="generate",
            show_progress="hidden",
        ).then(explore.refresh, explore.inputs, explore.outputs, show_progress="hidden", api_visibility="private")
        playback.play.click(
            play_live,
            [session, view_mode, panel.preset],
            outputs,
            inputs_kwargs=named(playback, projection),
            concurrency_limit=4,
            concurrency_id=PLAYBACK_GROUP,
            api_name="play",
            show_progress="hidden",
        ).then(explore.refresh, explore.inputs, explore.outputs, show_progress="hidden", api_visibility="private")

    return connect
