"""The Gradio Blocks: components and event wiring only.

Every handler turns component values into a request (:mod:`.inputs`, :mod:`.controls`),
drives a plain generator (:mod:`.live`, :mod:`.compare`) or a pure function (:mod:`.explore`,
:mod:`.learn`, :mod:`.export`) and places what it returns.  Events that run the model share
one Gradio concurrency group of size one and borrow the model from a :class:`ModelSlot`.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Callable, Iterator

import gradio as gr

from ..sweep import parse_budgets, parse_policies
from ..chat import REASONING_SYSTEM_PROMPT
from ..events import RecordingError
from ..faults import RunFault
from ..memory import CARDS_GB
from ..model import QUANTIZATIONS
from ..policies import REFERENCE_POLICY, policy_names
from ..policies.base import COMMON_PARAMS
from ..presets import MAX_NEW_TOKENS_RANGE
from ..replay import TraceError, load_trace
from ..viz.figures import compare_memory_figure, memory_figure, placeholder_figure
from ..viz.pareto import METRICS as PARETO_METRICS
from ..viz.pareto import pareto_figure
from ..viz.tokens import MODES, TOKEN_CSS
from . import explore, inputs
from .compare import FIDELITY_COLUMNS, MAX_POLICIES, MIN_POLICIES, compare_frames
from .controls import (ControlError, Pools, build_policy, collect_params, pool_bounds, pool_choices, pool_sizes,
                       slot_specs)
from ..export import export_figures, export_recording, import_recording
from .fields import slider
from .learn import learn_markdown
from .live import live_frames
from .model_slot import LoadStatus, ModelSlot, ModelUnavailable
from .runs import RunInputError
from .session import COMPARE_TOKENS_IDS, LIVE_TOKENS_ID, Session
from .stream import PATCH_BUS_JS, RESYNC_BUTTON_ID, bus_payload, container_html
from .sweep import TABLE_COLUMNS as SWEEP_COLUMNS
from .sweep import export_sweep, sweep_frames
from .text import no_markup, plain_markdown

DEFAULT_POLICY = "h2o"
MODEL_GROUP = "model"  # every event that runs the model: one at a time, across all sessions
USER_ERRORS = (ControlError, RunInputError, ModelUnavailable, RecordingError, RunFault, ValueError)

APP_CSS = TOKEN_CSS + """
.tv-container { max-height: 540px; overflow-y: auto; padding: 8px 10px; border: 1px solid #e5e7eb;
  border-radius: 8px; background: #fff; }
.tv-compare .tv-container { max-height: 380px; }
.tv-compare .tv-view { font-size: 12px; }
.tv-col-title { font-weight: 700; font-size: 15px; margin-bottom: 2px; }
.tv-status p { margin: 0; }
.tv-title h2 { margin: 0; }
#tv-model-status { text-align: right; align-self: center; }
.tv-notice p { font-size: 13px; }
.tv-download .empty { min-height: 0 !important; height: 44px !important; }
.tv-download .empty .icon { height: 24px; }
.tv-stats { display: flex; gap: 10px; flex-wrap: wrap; margin: 2px 0 4px; }
.tv-stat { background: #f6f7f9; border: 1px solid #e5e7eb; border-radius: 6px; padding: 3px 8px; }
.tv-stat span { color: #6b7280; font-size: 11px; margin-right: 6px; }
.tv-stat b { font-size: 13px; }
"""


def user_error(exc: Exception) -> gr.Error:
    """A toast with the exception's message (no traceback: the message says what to change)."""
    return gr.Error(no_markup(str(exc)), print_exception=False)  # toasts render HTML


def load_status_markdown(status: LoadStatus) -> str:
    """The model status line: a progress bar while loading, the error if it failed."""
    if status.error:
        return f"**Model failed to load:** {plain_markdown(status.error)}"
    if status.ready:
        note = f"  \n{plain_markdown(status.note)}" if status.note else ""
        return f"**Model:** {plain_markdown(status.message)}{note}"
    if not status.name:
        return "**Model:** not loaded"
    percent = int(round(100 * status.fraction))
    return f"**Model:** {plain_markdown(status.message)} <progress value='{percent}' max='100'></progress> {percent}%"


# ---- shared control groups ------------------------------------------------------------------
@dataclass
class PolicyControls:
    """The policy picker, the common knobs and the pool of per-policy parameter slots."""

    policy: gr.Dropdown
    budget: gr.Slider
    interval: gr.Slider
    protect_system: gr.Checkbox
    protect_question: gr.Checkbox
    pools: Pools  # lists of gr.Slider, gr.Checkbox and gr.Dropdown slots

    @property
    def slots(self) -> list:
        return [slot for pool in self.pools for slot in pool]

    def inputs(self) -> list:
        return [self.policy, self.budget, self.interval, self.protect_system, self.protect_question, *self.slots]

    def make(self, values: tuple):
        """The policy described by this group's values (in :meth:`inputs` order)."""
        name, budget, interval, protect_system, protect_question, *slots = values
        given, start = [], 0
        for pool in self.pools:
            given.append(slots[start : start + len(pool)])
            start += len(pool)
        params = collect_params(name, Pools(*given))
        return build_policy(name, params, budget=budget, interval=interval,
                            protect_system=protect_system, protect_question=protect_question)

    def updates(self, name: str, values: dict | None = None) -> list:
        """Component updates that show ``name``'s parameters in the slots."""
        specs = slot_specs(name, Pools(*map(len, self.pools)), values)
        hidden = gr.update(visible=False)
        out = []
        for spec in specs.numbers:
            out.append(hidden if spec is None else gr.update(
                visible=True, label=spec.label, info=spec.help, minimum=spec.low, maximum=spec.high,
                step=spec.step, value=spec.value))
        for spec in specs.flags:
            out.append(hidden if spec is None else gr.update(
                visible=True, label=spec.label, info=spec.help, value=spec.value))
        for spec in specs.choices:
            out.append(hidden if spec is None else gr.update(
                visible=True, label=spec.label, info=spec.help, choices=list(spec.choices), value=spec.value))
        return out


def common_sliders(interval: int, tab: str = "live") -> tuple[gr.Slider, gr.Slider]:
    """Budget and interval sliders over the ranges the policies declare for them."""
    params = {p.name: p for p in COMMON_PARAMS}
    b, i = params["budget"], params["interval"]
    budget = slider(b.low, b.high, value=b.default, step=b.step, label="Budget (tokens per layer and kv-head)",
                    info=b.help, elem_id=f"tv-{tab}-budget")
    interval_slider = slider(i.low, i.high, value=interval, step=i.step, label="Interval (compress every N tokens)",
                             info=i.help, elem_id=f"tv-{tab}-interval")
    return budget, interval_slider


def policy_controls(default: str) -> PolicyControls:
    """The policy group, its slots showing ``default``'s parameters.

    Number slots are built with a range covering every policy's parameters, and choice slots
    with every policy's choices, because Gradio checks a value against what the component has
    on the server: API callers never see the per-policy narrowing that
    :meth:`PolicyControls.updates` sends a browser (on page load and when the policy changes).
    """
    sizes = pool_sizes()
    low, high = pool_bounds()
    every_choice = pool_choices()
    specs = slot_specs(default, sizes)
    policy = gr.Dropdown(policy_names(), value=default, label="Policy", elem_id="tv-live-policy")
    budget, interval = common_sliders(interval=1)
    with gr.Row():
        protect_system = gr.Checkbox(value=True, label="Protect system prompt", elem_id="tv-live-protect-system")
        protect_question = gr.Checkbox(value=True, label="Protect question")
    numbers = [slider(low, high, value=spec.value if spec else low, visible=spec is not None,
                      label=spec.label if spec else f"parameter {i + 1}", info=spec.help if spec else None)
               for i, spec in enumerate(specs.numbers)]
    flags = [gr.Checkbox(value=bool(spec.value) if spec else False, visible=spec is not None,
                         label=spec.label if spec else f"option {i + 1}", info=spec.help if spec else None)
             for i, spec in enumerate(specs.flags)]
    choices = [gr.Dropdown(every_choice, value=spec.value if spec else every_choice[0], visible=spec is not None,
                           label=spec.label if spec else f"choice {i + 1}", info=spec.help if spec else None,
                           elem_id=f"tv-live-choice-{i}")
               for i, spec in enumerate(specs.choices)]
    group = PolicyControls(policy, budget, interval, protect_system, protect_question, Pools(numbers, flags, choices))
    if group.slots:
        policy.change(group.updates, policy, group.slots, show_progress="hidden", api_visibility="private")
    return group


@dataclass
class InputControls:
    """Preset picker and the chat to run (system, question, generate / replay, trace)."""

    preset: gr.Dropdown
    notice: gr.Markdown
    mode: gr.Radio
    system: gr.Textbox
    question: gr.Textbox
    trace: gr.Textbox

    def inputs(self) -> list:
        return [self.mode, self.system, self.question, self.trace]

    def preset_outputs(self) -> list:
        return [self.notice, self.mode, self.system, self.question, self.trace]


def input_controls(choices: list[tuple[str, str]], tab: str) -> InputControls:
    preset = gr.Dropdown(choices, value=None, label="Preset", elem_id=f"tv-{tab}-preset",
                         info="a question, a policy and, for replay, a hand-written reasoning trace")
    notice = gr.Markdown("", elem_classes="tv-notice")
    question = gr.Textbox(label="Question", lines=2, max_lines=8, placeholder="Ask something that needs reasoning…",
                          elem_id=f"tv-{tab}-question")
    mode = gr.Radio(list(inputs.RUN_MODES), value="generate", label="Run mode", elem_id=f"tv-{tab}-run-mode",
                    info="generate: the model writes; replay: teacher-force the trace")
    with gr.Accordion("System prompt and replay trace", open=False):
        system = gr.Textbox(label="System prompt (empty: none)", lines=3, value=REASONING_SYSTEM_PROMPT)
        trace = gr.Textbox("", label="Trace to replay (the assistant's text; replay mode)", lines=6, max_lines=12)
    return InputControls(preset, notice, mode, system, question, trace)


def preset_values(name: str | None) -> tuple[inputs.PresetChoice | None, list]:
    """The loaded preset and the values for :meth:`InputControls.preset_outputs`."""
    if not name:
        return None, [gr.skip()] * 5
    try:
        choice = inputs.choose_preset(name)
    except RunInputError as exc:
        raise user_error(exc) from None
    return choice, [choice.notice, choice.preset.mode, choice.system, choice.preset.question, choice.trace]


def decode_controls(tab: str) -> list:
    """Max new tokens, temperature and whether end-of-text stops the run (in that order)."""
    with gr.Row():
        max_new = slider(*MAX_NEW_TOKENS_RANGE, value=128, step=1, label="Max new tokens",
                         elem_id=f"tv-{tab}-max-new")
        temperature = slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature (0 = greedy)")
    stop_at_eos = gr.Checkbox(value=True, label="Stop at end of text", elem_id=f"tv-{tab}-stop-at-eos",
                              info="off: keep decoding to the limit, to watch eviction on a long run")
    return [max_new, temperature, stop_at_eos]


def export_controls(tab: str) -> tuple[gr.Button, gr.Button, gr.File]:
    """"Export recording", "Export figure" and the file they produce."""
    with gr.Row():
        recording = gr.Button("Export recording (JSON + NPZ)", size="sm", elem_id=f"tv-{tab}-export-run")
        figure = gr.Button("Export figure (HTML)", size="sm", elem_id=f"tv-{tab}-export-figure")
    file = gr.File(label="Download", interactive=False, elem_id=f"tv-{tab}-export", elem_classes="tv-download")
    return recording, figure, file


def nothing_yet(what: str) -> gr.Error:
    return gr.Error(f"Run something first: there is no {what} to export yet.", print_exception=False)


# ---- the app ----------------------------------------------------------------------------------
def build_app(slot: ModelSlot, model: str = "embedded", quantization: str = "4bit",
              model_loading: bool = True) -> gr.Blocks:
    """The whole UI.  ``slot`` holds the shared model; ``model`` starts loading when a page opens.

    ``model_loading=False`` leaves out the settings panel's model loader and its API endpoint,
    for an app that strangers can reach (any id or local folder could otherwise be loaded).
    """
    choices = inputs.preset_choices()
    with gr.Blocks(title="ThinkViz — KV-cache eviction, live", analytics_enabled=False) as demo:
        session = gr.State(lambda: Session())  # a factory: one Session per browser tab
        with gr.Row(equal_height=True, elem_classes="tv-header"):
            gr.Markdown("## ThinkViz\nWhat a KV-cache eviction policy keeps and drops, inside a real quantized model.",
                        elem_classes="tv-title")
            model_status = gr.Markdown(load_status_markdown(slot.status), elem_id="tv-model-status",
                                       elem_classes="tv-status")
        bus = gr.Textbox(visible="hidden", elem_id="tv-bus")
        bus.change(None, bus, None, js=PATCH_BUS_JS)
        resync = gr.Button(visible="hidden", elem_id=RESYNC_BUTTON_ID)
        resync.click(Session.resync, session, None, queue=False, api_visibility="private")
        with gr.Tabs():
            with gr.Tab("Live", id="live"):
                wire_live = _live_tab(slot, session, choices, model, quantization, model_status, bus, model_loading)
            with gr.Tab("Compare", id="compare"):
                wire_compare = _compare_tab(slot, session, choices, bus)
            with gr.Tab("Explore", id="explore") as explore_tab:
                explore_source = _explore_tab(session, explore_tab)
            with gr.Tab("Sweep", id="sweep"):
                _sweep_tab(slot, session, choices)
            with gr.Tab("Learn", id="learn"):
                gr.Markdown(learn_markdown(), elem_id="tv-learn")
        wire_live(demo, explore_source)
        wire_compare(explore_source)

        def watch_default() -> Iterator[str]:
            slot.start_once(model, quantization)
            for status in slot.watch():
                yield load_status_markdown(status)

        demo.load(watch_default, None, model_status, show_progress="hidden", api_visibility="private")
    return demo


# ---- Live -------------------------------------------------------------------------------------
def _live_tab(slot, session, choices, model, quantization, model_status, bus, model_loading) -> Callable:
    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            panel = input_controls(choices, "live")
            with gr.Row():
                generate = gr.Button("Generate", variant="primary", elem_id="tv-live-run")
                stop = gr.Button("Stop", variant="stop", elem_id="tv-live-stop")
            controls = policy_controls(DEFAULT_POLICY)
            decode = decode_controls("live")
            with gr.Row():
                target = gr.Dropdown(list(inputs.PROJECTION_TARGETS), value=inputs.DEFAULT_TARGET,
                                     label="Project memory onto", info="price the kept tokens on a bigger model")
                card = gr.Radio(list(CARDS_GB), value=inputs.DEFAULT_CARD, label="Card (GiB VRAM)",
                                elem_id="tv-live-card")
            _model_settings(slot, model, quantization, model_status, model_loading)
        with gr.Column(scale=3, min_width=420):
            status = gr.Markdown("Pick a preset or type a question, then Generate.", elem_id="tv-live-status",
                                 elem_classes="tv-status")
            stats = gr.HTML("", elem_id="tv-live-stats")
            view_mode = gr.Radio(list(MODES), value="combined", label="Token view", elem_id="tv-live-mode")
            gr.HTML(container_html(LIVE_TOKENS_ID))
            memory = gr.Plot(placeholder_figure("The KV cache's size appears here while a run streams"),
                             label="KV-cache memory", elem_id="tv-live-memory")
            export_run, export_fig, exported = export_controls("live")

    def pick_preset(name: str | None):
        choice, values = preset_values(name)
        if choice is None:
            return values + [gr.skip()] * (6 + len(controls.slots))
        p = choice.preset.params
        return values + [choice.preset.policy, p.get("budget", 256), p.get("interval", 1),
                         p.get("protect_system", True), p.get("protect_question", True),
                         *controls.updates(choice.preset.policy, p), choice.preset.max_new_tokens]

    panel.preset.change(
        pick_preset, panel.preset,
        panel.preset_outputs() + [controls.policy, controls.budget, controls.interval, controls.protect_system,
                                  controls.protect_question, *controls.slots, decode[0]],
        show_progress="hidden", api_visibility="private",
    )

    def switch_mode(s: Session, mode: str):
        s.live_channel.set_mode(mode)
        if s.running or s.live_view is None:
            return gr.skip()  # a running generator resets the view on its next frame
        return bus_payload(s.live_channel.message(s.live_view, reset=True))

    view_mode.change(switch_mode, [session, view_mode], bus, show_progress="hidden", api_visibility="private")

    def figure_for(s: Session, target_name: str, card_gb):
        try:
            return memory_figure(s.live_record, projection=inputs.projection(target_name, card_gb),
                                 device_stats=s.live_device_stats)
        except USER_ERRORS as exc:
            raise user_error(exc) from None

    def reproject(s: Session, target_name: str, card_gb):
        if s.live_record is None or s.running:
            return gr.skip()
        return figure_for(s, target_name, card_gb)

    for control in (target, card):
        control.change(reproject, [session, target, card], memory, show_progress="hidden",
                       api_visibility="private")

    stop.click(Session.stop, session, None, queue=False, api_name="stop")

    def do_export(s: Session):
        if s.live_record is None:
            raise nothing_yet("recording")
        return str(export_recording(s.live_record))

    def do_export_figure(s: Session, target_name: str, card_gb):
        if s.live_record is None:
            raise nothing_yet("figure")
        return str(export_figures({"KV-cache memory": figure_for(s, target_name, card_gb)}, stem="thinkviz-memory"))

    export_run.click(do_export, session, exported, api_name="export_recording")
    export_fig.click(do_export_figure, [session, target, card], exported, api_name="export_figure")

    def run_live(s: Session, mode: str, run_mode, system, question, trace, *rest):
        *policy_values, max_tokens, temp, stop_eos, target_name, card_gb = rest
        try:
            policy = controls.make(tuple(policy_values))
            request = inputs.run_input(run_mode, system, question, trace)
            settings = inputs.decode_settings(max_tokens, temp, stop_eos)
            projection = inputs.projection(target_name, card_gb)
        except USER_ERRORS as exc:
            raise user_error(exc) from None
        cancel = s.begin()
        s.live_channel.set_mode(mode)
        try:
            if not slot.status.ready:
                yield "Waiting for the model to load…", gr.skip(), gr.skip(), gr.skip(), gr.skip()
            with slot.use() as loaded:
                frames = live_frames(loaded, policy, request, settings, cancel, s.live_channel, projection)
                for frame in frames:
                    s.live_record, s.live_view, s.live_device_stats = frame.record, frame.view, frame.device_stats
                    source = gr.update(choices=s.sources(), value="Live run") if frame.done else gr.skip()
                    figure = gr.skip() if frame.figure is None else frame.figure
                    yield frame.status, bus_payload(frame.bus), figure, frame.stats, source
        except USER_ERRORS as exc:
            raise user_error(exc) from None
        finally:
            s.running = False

    def wire(demo: gr.Blocks, explore_source: gr.Dropdown) -> None:
        if controls.slots:
            demo.load(lambda: controls.updates(DEFAULT_POLICY), None, controls.slots, show_progress="hidden",
                      api_visibility="private")
        generate.click(
            run_live,
            [session, view_mode, *panel.inputs(), *controls.inputs(), *decode, target, card],
            [status, bus, memory, stats, explore_source],
            concurrency_limit=1, concurrency_id=MODEL_GROUP, api_name="generate", show_progress="hidden",
        )

    return wire


def _model_settings(slot: ModelSlot, model: str, quantization: str, model_status: gr.Markdown,
                    model_loading: bool) -> None:
    if not model_loading:
        with gr.Accordion("Model settings", open=False):
            gr.Markdown("Loading another model is off: this app can be reached from other machines. "
                        "Whoever started it can allow it with `python app.py --allow-model-loading`.",
                        elem_id="tv-model-loading-off")
        return
    with gr.Accordion("Model settings", open=False):
        name = gr.Textbox(value=model, label="Model", info="'embedded' (SmolLM2-135M, offline), a Hugging Face "
                                                          "id or a local folder")
        quant = gr.Radio(list(QUANTIZATIONS), value=quantization, label="Weights",
                         info="4bit: bitsandbytes NF4; none: unquantized (faster on a CPU)")
        load = gr.Button("Load model", size="sm")
        progress = gr.Markdown(elem_classes="tv-status")

    def load_model(name_value: str, quant_value: str) -> Iterator[tuple[str, str]]:
        if not (name_value or "").strip():
            raise gr.Error("Give a model: 'embedded', a Hugging Face id or a local folder.", print_exception=False)
        try:
            slot.start(name_value.strip(), quant_value)
        except ModelUnavailable as exc:
            raise user_error(exc) from None
        for status in slot.watch():
            line = load_status_markdown(status)
            yield line, line

    load.click(load_model, [name, quant], [progress, model_status], concurrency_limit=1,
               concurrency_id=MODEL_GROUP, api_name="load_model", show_progress="hidden")


# ---- Compare ----------------------------------------------------------------------------------
def _compare_tab(slot, session, choices, bus) -> Callable:
    with gr.Row():
        with gr.Column(scale=2, min_width=300):
            panel = input_controls(choices, "compare")
            policies = gr.CheckboxGroup(policy_names(), value=[REFERENCE_POLICY, "window", "h2o"],
                                        label=f"Policies ({MIN_POLICIES}–{MAX_POLICIES})",
                                        elem_id="tv-compare-policies")
            budget, interval = common_sliders(interval=8, tab="compare")
            with gr.Row():
                protect_system = gr.Checkbox(value=True, label="Protect system prompt",
                                             elem_id="tv-compare-protect-system")
                protect_question = gr.Checkbox(value=True, label="Protect question")
            measure = gr.Checkbox(value=True, label="Measure NLL / KL / top-1 against the full cache",
                                  info="generate mode: afterwards, teacher-force the full cache's text")
            decode = decode_controls("compare")
            with gr.Row():
                run = gr.Button("Compare", variant="primary", elem_id="tv-compare-run")
                stop = gr.Button("Stop", variant="stop")
        with gr.Column(scale=5, min_width=600):
            status = gr.Markdown("Pick 2–6 policies and press Compare.", elem_id="tv-compare-status",
                                 elem_classes="tv-status")
            view_mode = gr.Radio(list(MODES), value="combined", label="Token view")
            headers, columns = [], []
            with gr.Row(elem_classes="tv-compare"):
                for i, target_id in enumerate(COMPARE_TOKENS_IDS):
                    with gr.Column(visible=i < 3, min_width=220) as column:
                        headers.append(gr.HTML("", elem_id=f"tv-compare-head-{i}"))
                        gr.HTML(container_html(target_id))
                    columns.append(column)
            overlay = gr.Plot(placeholder_figure("Each policy's KV cache appears here"),
                              label="KV-cache memory, all policies", elem_id="tv-compare-memory")
            table = gr.Dataframe(headers=FIDELITY_COLUMNS, label="Fidelity against the full cache",
                                 interactive=False, elem_id="tv-compare-table", wrap=True)
            with gr.Row():
                export_fig = gr.Button("Export figure (HTML)", size="sm", elem_id="tv-compare-export-figure")
            exported = gr.File(label="Download (open a column in Explore to export its recording)",
                               interactive=False, elem_id="tv-compare-export", elem_classes="tv-download")

    def pick_preset(name: str | None):
        choice, values = preset_values(name)
        if choice is None:
            return values + [gr.skip()] * 6
        preset, p = choice.preset, choice.preset.params
        wanted = list(preset.compare) or [REFERENCE_POLICY, preset.policy]
        known = [n for n in wanted if n in policy_names()][:MAX_POLICIES]
        left_out = [n for n in wanted if n not in known]
        if left_out:
            values[0] += f"\n\n_Showing {', '.join(known)}; also listed: {plain_markdown(', '.join(left_out))}._"
        return values + [known, p.get("budget", 256), p.get("interval", 1), p.get("protect_system", True),
                         p.get("protect_question", True), preset.max_new_tokens]

    panel.preset.change(
        pick_preset, panel.preset,
        panel.preset_outputs() + [policies, budget, interval, protect_system, protect_question, decode[0]],
        show_progress="hidden", api_visibility="private",
    )
    stop.click(Session.stop, session, None, queue=False, api_name="stop_compare")

    def do_export_figure(s: Session):
        if not s.compare_records:
            raise nothing_yet("comparison")
        return str(export_figures({"KV cache by policy": compare_memory_figure(s.compare_records)},
                                  stem="thinkviz-compare"))

    export_fig.click(do_export_figure, session, exported, api_name="export_compare_figure")
    policies.change(lambda names: [gr.update(visible=i < max(MIN_POLICIES, len(names or [])))
                                   for i in range(len(columns))],
                    policies, columns, show_progress="hidden", api_visibility="private")

    def switch_mode(s: Session, mode: str):
        for channel in s.compare_channels:
            channel.set_mode(mode)
        if s.running or not s.compare_views:
            return gr.skip()
        return bus_payload([c.message(v, reset=True) for c, v in zip(s.compare_channels, s.compare_views)])

    view_mode.change(switch_mode, [session, view_mode], bus, show_progress="hidden", api_visibility="private")

    def run_compare(s: Session, mode, run_mode, system, question, trace, names, budget_value, interval_value,
                    protect_s, protect_q, measure_fidelity, max_tokens, temp, stop_eos):
        names = list(names or [])
        try:
            if not MIN_POLICIES <= len(names) <= MAX_POLICIES:
                raise RunInputError(f"Choose between {MIN_POLICIES} and {MAX_POLICIES} policies (got {len(names)}).")
            chosen = [build_policy(n, {}, budget=budget_value, interval=interval_value,
                                   protect_system=protect_s, protect_question=protect_q) for n in names]
            request = inputs.run_input(run_mode, system, question, trace)
            settings = inputs.decode_settings(max_tokens, temp, stop_eos)
        except USER_ERRORS as exc:
            raise user_error(exc) from None
        cancel = s.begin()
        channels = s.compare_channels[: len(names)]
        for channel in channels:
            channel.set_mode(mode)
        column_updates = [gr.update(visible=i < len(names)) for i in range(len(columns))]
        try:
            if not slot.status.ready:
                yield ["Waiting for the model to load…", *[gr.skip()] * 4, *[gr.skip()] * len(headers),
                       *column_updates]
            with slot.use() as loaded:
                for frame in compare_frames(loaded, chosen, request, settings, cancel, channels,
                                            bool(measure_fidelity)):
                    s.compare_records, s.compare_views = frame.records, frame.views
                    source = gr.update(choices=s.sources()) if frame.done else gr.skip()
                    head = frame.headers + [""] * (len(headers) - len(frame.headers))
                    figure = gr.skip() if frame.figure is None else frame.figure
                    yield [frame.status, bus_payload(frame.bus), figure, frame.table, source, *head,
                           *column_updates]
        except USER_ERRORS as exc:
            raise user_error(exc) from None
        finally:
            s.running = False

    def wire(explore_source: gr.Dropdown) -> None:
        run.click(
            run_compare,
            [session, view_mode, *panel.inputs(), policies, budget, interval, protect_system, protect_question,
             measure, *decode],
            [status, bus, overlay, table, explore_source, *headers, *columns],
            concurrency_limit=1, concurrency_id=MODEL_GROUP, api_name="compare", show_progress="hidden",
        )

    return wire


# ---- Explore ----------------------------------------------------------------------------------
def _explore_tab(session: gr.State, tab: gr.Tab) -> gr.Dropdown:
    with gr.Row():
        with gr.Column(scale=2):
            source = gr.Dropdown([], value=None, label="Run to explore", info="the last Live run or a Compare column",
                                 elem_id="tv-explore-source")
            open_source = gr.Button("Open", size="sm", elem_id="tv-explore-open")
        upload = gr.File(label="…or open a recording (.zip, or .json + .npz)", file_count="multiple",
                         file_types=[".zip", ".json", ".npz"], elem_id="tv-explore-upload", scale=3, height=140)
    caption = gr.Markdown("Nothing to explore yet: run something, or open a recording.",
                          elem_id="tv-explore-caption")
    with gr.Row():
        step = slider(0, 1, value=0, step=1, label="Step (timeline)", elem_id="tv-explore-step", scale=3)
        layer = gr.Dropdown([explore.AVERAGE], value=explore.AVERAGE, label="Layer", scale=1,
                            elem_id="tv-explore-layer")
        head = gr.Dropdown([explore.AVERAGE], value=explore.AVERAGE, label="KV head", scale=1,
                           elem_id="tv-explore-head")
    mode = gr.Radio(list(MODES), value="combined", label="Token view")
    tokens = gr.HTML("", elem_id="tv-explore-tokens")
    heatmap = gr.Plot(label="Kept per step and position", elem_id="tv-explore-heatmap")
    segments = gr.Dataframe(label="Segments at this step", interactive=False, elem_id="tv-explore-segments")
    view_outputs = [caption, tokens, heatmap, segments]
    export_run, export_fig, exported = export_controls("explore")

    def do_export(s: Session):
        if s.explore_record is None:
            raise nothing_yet("recording")
        return str(export_recording(s.explore_record))

    def do_export_figure(s: Session, step_value, layer_value, head_value, mode_value):
        if s.explore_record is None:
            raise nothing_yet("figure")
        try:
            view = explore.explore_view(s.explore_record, int(step_value), layer_value, head_value, mode_value)
        except USER_ERRORS as exc:
            raise user_error(exc) from None
        return str(export_figures({"Keep / evict": view.heatmap}, stem="thinkviz-keep"))

    def show(s: Session, step_value, layer_value, head_value, mode_value) -> list:
        if s.explore_record is None:
            return [gr.skip()] * len(view_outputs)
        try:
            view = explore.explore_view(s.explore_record, int(step_value), layer_value, head_value, mode_value)
        except USER_ERRORS as exc:
            raise user_error(exc) from None
        return [view.caption, f"<div class='tv-container'>{view.tokens_html}</div>", view.heatmap, view.segments]

    def open_record(s: Session, record, mode_value: str) -> list:
        s.explore_record = record
        last = max(0, len(record.events) - 1)
        return [
            gr.update(maximum=max(1, last), value=last, interactive=last > 0),
            gr.update(choices=explore.layer_choices(record), value=explore.AVERAGE),
            gr.update(choices=explore.head_choices(record), value=explore.AVERAGE),
            *show(s, last, explore.AVERAGE, explore.AVERAGE, mode_value),
        ]

    def from_source(s: Session, name: str | None, mode_value: str) -> list:
        record = s.record_for(name or "")
        if record is None:
            raise gr.Error("Choose a run first (run something in Live or Compare).", print_exception=False)
        return open_record(s, record, mode_value)

    def on_select(s: Session, mode_value: str) -> list:
        sources = s.sources()
        if s.explore_record is not None or not sources:
            return [gr.skip()] * (4 + len(view_outputs))
        return [gr.update(value=sources[0]), *open_record(s, s.record_for(sources[0]), mode_value)]

    def from_upload(s: Session, files, mode_value: str) -> list:
        if not files:
            return [gr.skip()] * (3 + len(view_outputs))
        try:
            record = import_recording(files if isinstance(files, list) else [files])
        except USER_ERRORS as exc:
            raise user_error(exc) from None
        return open_record(s, record, mode_value)

    pickers = [step, layer, head]
    export_run.click(do_export, session, exported, api_name="export_explored_recording")
    export_fig.click(do_export_figure, [session, step, layer, head, mode], exported, api_name="export_keep_figure")
    open_source.click(from_source, [session, source, mode], pickers + view_outputs, show_progress="hidden",
                      api_visibility="private")
    tab.select(on_select, [session, mode], [source, *pickers, *view_outputs], show_progress="hidden",
               api_visibility="private")
    upload.upload(from_upload, [session, upload, mode], pickers + view_outputs, show_progress="hidden",
                  api_name="open_recording")
    for control in (step, layer, head, mode):
        control.change(show, [session, step, layer, head, mode], view_outputs, show_progress="hidden",
                       trigger_mode="always_last", api_visibility="private")
    return source


# ---- Sweep ------------------------------------------------------------------------------------
def _sweep_tab(slot: ModelSlot, session: gr.State, choices) -> None:
    loaded_presets = {name: inputs.choose_preset(name) for _, name in choices}
    replay = [(title, name) for title, name in choices if loaded_presets[name].preset.mode == "replay"]
    shortest = min(replay, key=lambda choice: len(loaded_presets[choice[1]].trace), default=(None, None))[1]
    gr.Markdown("Replay one trace through every chosen policy at every budget, in lockstep with the full cache, "
                "and plot peak KV memory against fidelity. Long traces take minutes on a CPU.")
    with gr.Row():
        with gr.Column(scale=2, min_width=300):
            preset = gr.Dropdown(replay, value=shortest, label="Trace (replay preset)", elem_id="tv-sweep-preset")
            policies = gr.CheckboxGroup([n for n in policy_names() if n != REFERENCE_POLICY], value=["window", "h2o"],
                                        label="Policies (the full cache is always the reference)")
            budgets = gr.Textbox("0.25, 0.5", label="Budgets",
                                 info="fractions of the sequence (0.25) and/or token counts (256), comma-separated")
            interval = slider(1, 128, value=32, step=1, label="Interval (tokens per forward pass)")
            limit = slider(0, 8192, value=512, step=64, label="Trace tokens to replay (0 = the whole trace)",
                           info="the first tokens of the trace: a quick sweep on a CPU", elem_id="tv-sweep-limit")
            metric = gr.Radio(list(PARETO_METRICS), value="kl", label="Fidelity axis")
            run = gr.Button("Run sweep", variant="primary", elem_id="tv-sweep-run")
        with gr.Column(scale=5, min_width=600):
            status = gr.Markdown("", elem_id="tv-sweep-status", elem_classes="tv-status")
            figure = gr.Plot(label="Memory vs fidelity", elem_id="tv-sweep-pareto")
            table = gr.Dataframe(headers=SWEEP_COLUMNS, label="Runs", interactive=False)
            files = gr.File(label="Sweep results (CSV, JSON, Pareto plot…)", file_count="multiple",
                            interactive=False, elem_classes="tv-download")

    def run_sweep(s: Session, name: str | None, names: list[str], budget_text: str, interval_value, limit_value,
                  metric_value):
        try:
            if not name:
                raise RunInputError("Choose a trace to sweep.")
            trace = load_trace(name)
            budget_list = parse_budgets(budget_text or "")
            chosen = parse_policies(",".join(names or []))
        except (TraceError, ValueError) as exc:
            raise user_error(exc) from None
        try:
            if not slot.status.ready:
                yield "Waiting for the model to load…", gr.skip(), gr.skip(), gr.skip()
            with slot.use() as loaded:
                frames = sweep_frames(loaded, trace, chosen, budget_list, int(interval_value), {}, metric_value,
                                      max_trace_tokens=int(limit_value) or None)
                for frame in frames:
                    if frame.rows is None:
                        yield frame.status, gr.skip(), gr.skip(), gr.skip()
                        continue
                    s.sweep_rows = frame.rows
                    meta = {"model": loaded.name, "quantization": loaded.quantization, "trace": trace.name,
                            "interval": int(interval_value), "budgets": budget_text, "policies": chosen,
                            "max_trace_tokens": int(limit_value) or None}
                    paths = export_sweep(frame.rows, meta, tempfile.mkdtemp(prefix="thinkviz-sweep-"))
                    yield frame.status, frame.figure, frame.table, paths
        except USER_ERRORS as exc:
            raise user_error(exc) from None

    run.click(run_sweep, [session, preset, policies, budgets, interval, limit, metric],
              [status, figure, table, files], concurrency_limit=1, concurrency_id=MODEL_GROUP, api_name="sweep",
              show_progress="hidden")

    def replot(s: Session, metric_value: str):
        return gr.skip() if not s.sweep_rows else pareto_figure(s.sweep_rows, metric_value)

    metric.change(replot, [session, metric], figure, show_progress="hidden", api_visibility="private")
