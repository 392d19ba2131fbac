"""What to run, as the user sets it: presets, the chat, generate vs replay, decode settings.

Pure helpers turning presets and control values into run requests; the Gradio panels that
show them are built in :mod:`thinkviz.ui.app`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..measure.inspection import inspect_trace
from ..core.kvquant import RESIDUAL, KVQuant, KVQuantError
from ..memory import TARGETS, Projection, TargetModel
from ..models.loading import LoadedModel
from ..demos.presets import Preset, PresetError, list_presets, load_preset
from ..measure.replay import Trace, trace_from_text
from ..text.reasoning import reasoning_format
from ..text.transcript import MAX_TRACE_FILE_BYTES, TraceError, decode_trace, is_transcript, parse_transcript
from ..viz.tables import turn_preview
from ..measure.requests import RunInputError
from ..demos.record import named_preset
from .text import no_markup

NO_PROJECTION = "none"
LOADED_TARGET = "the loaded model"  # priced on the config of the model the app has loaded
PROJECTION_TARGETS = (NO_PROJECTION, LOADED_TARGET, *TARGETS)
DEFAULT_TARGET = "Qwen3-4B"
DEFAULT_CARD = 8


@dataclass(frozen=True)
class PresetChoice:
    """A preset as the controls show it (``system`` filled with the reasoning prompt when unset)."""

    preset: Preset
    system: str
    trace: str

    @property
    def notice(self) -> str:
        return f"**{no_markup(self.preset.title)}**\n\n{no_markup(self.preset.notice)}"


def choose_preset(name: str) -> PresetChoice:
    """Load preset ``name`` (a name from :func:`list_presets`, never a path) for the controls;
    :class:`RunInputError` with the preset's reason."""
    preset = named_preset(name)
    return PresetChoice(preset, preset.system_prompt, preset.trace or "")


def preset_choices() -> list[tuple[str, str]]:
    """``(label, name)`` pairs for a dropdown: the preset's title, its file stem."""
    out = []
    for name in list_presets():
        try:
            out.append((load_preset(name).title, name))
        except PresetError:
            continue  # a broken preset is reported when picked, not at start-up
    return out


FIRST_PRESET = "generate_muffins"  # Live's preset on a fresh page: a short generation, recorded


def first_preset(choices: list[tuple[str, str]]) -> str | None:
    """The preset a fresh page opens Live with (:data:`FIRST_PRESET`, else the first of ``choices``,
    ``(label, name)`` pairs; ``None`` without any), so a lesson starts with one click on Play."""
    names = [name for _, name in choices]
    return FIRST_PRESET if FIRST_PRESET in names else next(iter(names), None)


def replay_choices(choices: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], str | None]:
    """The replay presets among ``choices`` (``(label, name)`` pairs), labelled by their trace
    (``"math_tilings · tam_math"``: the trace file, then the preset whose question and knobs come
    with it), and the one with the shortest trace (a quick default), or ``None`` when there is none."""
    loaded = {name: choose_preset(name).preset for _, name in choices}
    replay = [
        (f"{PurePosixPath(loaded[name].trace_file or name).stem} · {name}", name)
        for _, name in choices
        if loaded[name].mode == "replay"
    ]
    replay.sort()
    return replay, min((name for _, name in replay), key=lambda name: len(loaded[name].trace or ""), default=None)


def kv_quant(fmt: Any, residual: Any = RESIDUAL) -> KVQuant:
    """The KV format the controls ask for; :class:`RunInputError` with the reason otherwise."""
    try:
        return KVQuant.parse(str(fmt or "none"), int(round(float(residual))))
    except (TypeError, ValueError) as exc:  # KVQuantError is a ValueError
        raise RunInputError(str(exc) if isinstance(exc, KVQuantError) else f"Bad KV setting: {exc}") from None


def projection(target: str | None, card_gb: Any, loaded: LoadedModel | None = None) -> Projection | None:
    """The memory projection the controls ask for, or ``None`` (none asked, or :data:`LOADED_TARGET`
    while no model is loaded).  :data:`LOADED_TARGET` prices the tokens on ``loaded``'s own config
    (:meth:`TargetModel.from_config`: its layers, kv-heads, head size), a cache in bf16."""
    if not target or target == NO_PROJECTION or (target == LOADED_TARGET and loaded is None):
        return None
    try:
        if target == LOADED_TARGET:
            return Projection(TargetModel.from_config(loaded.name, loaded.model.config), float(card_gb))
        return Projection.named(target, float(card_gb))
    except (TypeError, ValueError) as exc:
        raise RunInputError(f"Bad projection: {exc}") from None


def read_upload(path: str | None) -> str:
    """The text of an uploaded trace or transcript file (what the trace box then holds);
    :class:`RunInputError` for a file that is too large, binary, not UTF-8 or empty."""
    if not path:
        raise RunInputError("No file was uploaded.")
    file = Path(path)
    what = f"the uploaded file {file.name}"
    try:
        if file.stat().st_size > MAX_TRACE_FILE_BYTES:
            raise RunInputError(f"{what} is larger than {MAX_TRACE_FILE_BYTES // 2**20} MiB")
        return decode_trace(file.read_bytes(), what)
    except TraceError as exc:
        raise RunInputError(str(exc)) from None
    except OSError as exc:
        raise RunInputError(f"cannot read {what} ({exc.strerror})") from None


@dataclass(frozen=True)
class FileChat:
    """The system prompt (``None``: the file has none) and question a trace file brings."""

    system: str | None
    question: str


def file_chat(text: str) -> FileChat | None:
    """What a trace or transcript file says in place of the System prompt and Question boxes: a
    transcript that starts with its own system or user message stands alone (the boxes are not
    used); ``None`` for the assistant's text or a transcript that continues the boxes' chat."""
    if not is_transcript(text):
        return None
    try:
        messages = parse_transcript(text, continues=True)
    except TraceError:  # the turn preview says why
        return None
    if not messages or messages[0].role not in ("system", "user"):
        return None
    trace = Trace.of_transcript("file", messages)
    return FileChat(trace.system, trace.question)


def can_switch_thinking(loaded: LoadedModel | None) -> bool:
    """Whether ``loaded``'s chat template switches thinking on and off (Qwen3's ``enable_thinking``;
    ``False`` while none is loaded)."""
    return loaded is not None and reasoning_format(loaded.tokenizer).switchable


def trace_preview(
    loaded: LoadedModel | None, mode: str, system: str | None, question: str | None, trace: str | None
) -> tuple[str, list[list]]:
    """A caption and one row per turn (:func:`~thinkviz.viz.tables.turn_preview`) for what the
    replay would run; token counts need ``loaded`` (its tokenizer only, no forward pass).  A
    trace that cannot be replayed gets the reason as its caption, never an exception: the
    preview follows the trace box as it is typed."""
    if mode != "replay" or not (trace or "").strip():
        return "", []
    try:
        chosen = trace_from_text(trace or "", (system or "").strip() or None, question or "")
        report = None if loaded is None else inspect_trace(loaded.tokenizer, loaded.geometry.max_context, chosen)
    except TraceError as exc:
        return f"**Cannot replay this:** {no_markup(str(exc))}", []
    rows = turn_preview(chosen.conversation, report)
    form = "a transcript" if chosen.messages is not None else "the assistant's text after the question"
    if report is None:
        return f"{len(rows)} turns ({form}); token counts appear once the model is loaded.", rows
    turns = report["turns"]
    prefilled = sum(t["tokens"] for t in turns if t["prefilled"])
    total = turns[-1]["end"]
    return (
        f"{len(rows)} turns ({form}): {total:,} tokens, {prefilled:,} prefilled and {total - prefilled:,} "
        f"teacher-forced; {len(report['think_blocks'])} think blocks."
    ), rows
