"""What to run, as Live and Compare ask for it: a preset picker and the chat (system prompt,
question, generate or replay, the trace), with the replay panel that reads a trace or transcript
file and previews its turns, counted with the loaded model's tokenizer.
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

    def inputs(self) -> list:
        return [self.run_mode, self.system, self.question, self.trace]

    @staticmethod
    def request(values: Sequence[Any], limit: Any = None) -> RunInput:
        """The run the values (in :meth:`inputs` order) describe, replaying at most ``limit`` trace
        tokens (0 or ``None``: all); :class:`RunInputError` if none."""
        return run_input(*values, max_tokens=limit)

    def preset_outputs(self) -> list:
        """The controls a preset fills (what :meth:`preset_updates` may update)."""
        return [self.notice, self.run_mode, self.system, self.question, self.trace]

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
            self.system: choice.system,
            self.question: choice.preset.question,
            self.trace: choice.trace,
        }


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
        label="Question",
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
        system = gr.Textbox(label="System prompt (empty: none)", lines=3, value=REASONING_SYSTEM_PROMPT)
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
    panel = InputControls(preset, notice, mode, system, question, trace, upload, caption, preview)

    def uploaded(path: str | None) -> list:
        try:
            return [inputs.read_upload(path), "replay"]
        except RunInputError as exc:
            raise user_error(exc) from None

    upload.upload(uploaded, upload, [trace, mode], show_progress="hidden", api_visibility="private")

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
