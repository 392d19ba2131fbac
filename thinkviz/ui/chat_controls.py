"""What to run, as Live and Compare ask for it: a preset picker and the chat (system prompt,
question, generate or replay, the trace), with the replay panel that reads a trace or transcript
file and previews its turns, counted with the loaded model's tokenizer; an uploaded transcript's
own system prompt and question shown in their boxes, read-only.  And what Live adds: the trace
tokens to replay, measuring against the full cache, and "Enable thinking" for a model whose chat
template has that switch (Qwen3's ``enable_thinking``), shown only while such a model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Sequence

import gradio as gr

from ..measure.requests import RUN_MODES, RunInput, RunInputError, run_input
from ..text.chat import REASONING_SYSTEM_PROMPT
from ..viz.tables import TURN_PREVIEW_HEADERS
from . import inputs
from .fields import slider
from .handlers import user_error
from .model_slot import ModelSlot
from .widgets import Group
from .wiring import bind


@dataclass
class InputControls(Group):
    """Preset picker and the chat to run (system, question, generate / replay, trace), with the
    replay panel: a trace or transcript file to upload and a preview of its turns."""

    preset: gr.Dropdown
    notice: gr.Markdown
    run_mode: gr.Radio
    system: gr.Textbox
    question: gr.Textbox
    trace: gr.Textbox
    upload: gr.File
    preview_caption: gr.Markdown
    preview: gr.Dataframe
    kept: gr.State  # the boxes' own (system, question) while an uploaded file's show in them, else None

    def inputs(self) -> list:
        return [self.run_mode, self.system, self.question, self.trace]

    @staticmethod
    def request(values: Sequence[Any], limit: Any = None, enable_thinking: Any = True) -> RunInput:
        """The run the values (in :meth:`inputs` order) describe, replaying at most ``limit`` trace
        tokens (0 or ``None``: all), thinking or not where the model can switch it;
        :class:`RunInputError` if none."""
        return run_input(*values, max_tokens=limit, enable_thinking=enable_thinking)

    def preset_outputs(self) -> list:
        """The controls a preset fills (what :meth:`preset_updates` may update)."""
        return [self.notice, self.run_mode, self.system, self.question, self.trace, self.kept]

    def preset_updates(self, name: str | None) -> tuple[inputs.PresetChoice | None, dict[Any, Any]]:
        """The preset ``name`` (``None`` when none is picked) and what its chat fills in, by component."""
        if not name:
            return None, {}
        try:
            choice = inputs.choose_preset(name)
        except RunInputError as exc:
            raise user_error(exc) from None
        return choice, {
            self.notice: choice.notice,
            self.run_mode: choice.preset.mode,
            **self.own_boxes(choice.system, choice.preset.question),
            self.trace: choice.trace,
            self.kept: None,
        }

    def own_boxes(self, system: str | None, question: str) -> dict[Any, Any]:
        """The System prompt and Question boxes editable again, holding ``system`` and ``question``."""
        return {
            self.system: gr.update(value=system or "", interactive=True, label=SYSTEM_LABEL),
            self.question: gr.update(value=question, interactive=True, label=QUESTION_LABEL),
        }

    def file_boxes(self, chat: inputs.FileChat) -> dict[Any, Any]:
        """The boxes showing what an uploaded file uses in their place, read-only."""
        none = ": none" if chat.system is None else ""
        return {
            self.system: gr.update(
                value=chat.system or "", interactive=False, label=f"{SYSTEM_LABEL} {FROM_FILE}{none}"
            ),
            self.question: gr.update(value=chat.question, interactive=False, label=f"{QUESTION_LABEL} {FROM_FILE}"),
        }


SYSTEM_LABEL, QUESTION_LABEL = "System prompt (empty: none)", "Question"
FROM_FILE = "— from the file (read-only)"


def uploaded(panel: InputControls, path: str | None, system: str, question: str, kept: tuple | None) -> dict:
    """An uploaded trace or transcript goes into the trace box (replay mode); a transcript with its
    own system or user message shows them in the System prompt and Question boxes, read-only, the
    boxes' own values kept for when the file goes."""
    try:
        text = inputs.read_upload(path)
    except RunInputError as exc:
        raise user_error(exc) from None
    updates: dict[Any, Any] = {panel.trace: text, panel.run_mode: "replay"}
    chat = inputs.file_chat(text)
    if chat is not None:
        updates.update(panel.file_boxes(chat))
        updates[panel.kept] = kept if kept is not None else (system, question)
    elif kept is not None:  # a file that uses the boxes replaces one that did not
        updates.update(released(panel, kept))
    return updates


def released(panel: InputControls, kept: tuple | None) -> dict:
    """The boxes back to their own values, editable (nothing while no file holds them)."""
    if kept is None:
        return {}
    return {**panel.own_boxes(*kept), panel.kept: None}


def cleared(panel: InputControls, kept: tuple | None) -> dict:
    """The uploaded file removed: its trace leaves the trace box, and the boxes are the user's again."""
    return {panel.trace: "", **released(panel, kept)}


def switched(panel: InputControls, mode: str, kept: tuple | None) -> dict:
    """Generate chosen by hand: the file is not used, so the boxes are the user's again (and nothing
    changes otherwise: Gradio reads an empty dict as one output value, so that is a skip)."""
    return (released(panel, kept) if mode == "generate" else {}) or gr.skip()


def input_controls(choices: list[tuple[str, str]], tab: str, slot: ModelSlot) -> InputControls:
    """The chat controls; the turn preview follows them, counted with ``slot``'s tokenizer once loaded."""
    preset = gr.Dropdown(
        choices,
        value=None,
        label="Preset",
        elem_id=f"tv-{tab}-preset",
        elem_classes="tv-bar",
        info="a question, a policy and, for replay, a hand-written reasoning trace",
    )
    notice = gr.Markdown("", elem_classes="tv-notice")
    question = gr.Textbox(
        "",
        label=QUESTION_LABEL,
        lines=2,
        max_lines=8,
        placeholder="Ask something that needs reasoning…",
        elem_id=f"tv-{tab}-question",
    )
    mode = gr.Radio(
        list(RUN_MODES),
        value="generate",
        label="Run mode",
        elem_id=f"tv-{tab}-run-mode",
        info="generate: the model writes; replay: teacher-force the trace",
    )
    with gr.Accordion("System prompt and replay trace or transcript", open=False):
        system = gr.Textbox(label=SYSTEM_LABEL, lines=3, value=REASONING_SYSTEM_PROMPT, elem_id=f"tv-{tab}-system")
        trace = gr.Textbox(
            "",
            label="Trace to replay: the assistant's text, or a transcript (lines starting "
            "SYSTEM:, USER:, ASSISTANT:, TOOL:, or JSON / JSONL messages)",
            lines=6,
            max_lines=12,
            elem_id=f"tv-{tab}-trace",
        )
        upload = gr.File(
            label="…or upload one (.json, .jsonl, .txt, .md)",
            type="filepath",
            height=90,
            file_types=[".json", ".jsonl", ".txt", ".md"],
            elem_id=f"tv-{tab}-upload",
        )
        caption = gr.Markdown("", elem_id=f"tv-{tab}-turns-caption")
        preview = gr.Dataframe(
            headers=TURN_PREVIEW_HEADERS,
            value=[],
            label="Turns of the replay (blocks: think blocks)",
            interactive=False,
            wrap=True,
            column_widths=["10%", "21%", "15%", "14%", "40%"],
            elem_id=f"tv-{tab}-turns",
        )
    kept = gr.State(None)
    panel = InputControls(preset, notice, mode, system, question, trace, upload, caption, preview, kept)
    hidden = {"show_progress": "hidden", "api_visibility": "private"}
    boxes = [system, question, kept]
    upload.upload(bind(uploaded, panel), [upload, system, question, kept], [trace, mode, *boxes], **hidden)
    upload.clear(bind(cleared, panel), kept, [trace, *boxes], **hidden)
    mode.input(bind(switched, panel), [mode, kept], boxes, **hidden)

    def preview_turns(*values: Any) -> list:
        caption_text, rows = inputs.trace_preview(slot.loaded, *values)
        return [caption_text, gr.Dataframe(value=rows, visible=bool(rows))]

    # one listener for every input: its runs queue in order, so a preview computed from older values
    # (the mode switched before the trace was typed) never lands after the newest one
    gr.on(
        [control.change for control in panel.inputs()],
        preview_turns,
        panel.inputs(),
        [caption, preview],
        show_progress="hidden",
        trigger_mode="always_last",
        api_visibility="private",
    )
    return panel


def trace_limit(tab: str) -> gr.Slider:
    """The first N trace tokens to replay (0: all), as the Sweep tab has: a quick look at a long trace."""
    return slider(
        0,
        8192,
        value=0,
        step=32,
        label="Trace tokens to replay (0 = the whole trace)",
        info="replay mode: only the trace's first tokens, for a quick look or a tuning loop",
        elem_id=f"tv-{tab}-limit",
    )


@dataclass
class LiveOptions(Group):
    """What Live adds after the shared groups (at the end of its API): the trace tokens to replay,
    whether to measure fidelity against the full cache, and whether a Qwen3-style model thinks."""

    max_trace_tokens: gr.Slider
    measure_fidelity: gr.Checkbox
    enable_thinking: gr.Checkbox

    def inputs(self) -> list:
        return [self.max_trace_tokens, self.measure_fidelity, self.enable_thinking]


def live_options() -> LiveOptions:
    limit = trace_limit("live")
    measure = gr.Checkbox(
        value=False,
        label="Measure against the full cache",
        elem_id="tv-live-measure",
        info="ΔNLL and KL per token: a replay runs in lockstep with the full cache; "
        "a generation is teacher-forced through both afterwards",
    )
    thinking = gr.Checkbox(
        value=True,
        label="Enable thinking",
        elem_id="tv-live-thinking",
        info="the loaded model's chat template switches thinking on or off (Qwen3's enable_thinking); "
        "off: it answers without a think block",
        visible=False,
    )
    return LiveOptions(limit, measure, thinking)


def thinking_switch(slot: ModelSlot) -> dict:
    """The "Enable thinking" checkbox, shown while the loaded model can switch thinking (hidden otherwise)."""
    return gr.update(visible=slot.status.ready and inputs.can_switch_thinking(slot.loaded))
