"""Starting runs from what the user typed.

Shared by the Live and Compare tabs, preset recordings and scripts: a :class:`RunInput` is a chat
(system prompt + question) and, in replay mode, the assistant text — or a transcript — to
teacher-force instead of generating; :func:`run_input` and :func:`decode_settings` build and check
them from raw control values, :func:`prepare` tokenizes them for a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.engine import DecodeSettings, EngineError
from ..text.chat import ChatPrompt, build_chat
from ..text.reasoning import reasoning_format
from ..models.loading import LoadedModel
from .replay import TraceError, trace_from_text
from .replay import prepare as prepare_replay
from ..text.transcript import is_transcript

RUN_MODES = ("generate", "replay")


class RunInputError(ValueError):
    """The input cannot be run; the message is shown to the user as is."""


@dataclass(frozen=True)
class RunInput:
    """A chat to run; ``trace`` (assistant text) switches from generating to replaying it, and
    ``max_tokens`` replays only its first tokens (a quick look at a long trace).  ``enable_thinking``
    ``False`` switches thinking off in a generation, for a model whose chat template has that switch
    (Qwen3; :func:`~thinkviz.text.reasoning.reasoning_format`); other models ignore it."""

    system: str | None
    question: str
    trace: str | None = None
    max_tokens: int | None = None
    enable_thinking: bool = True

    @property
    def replay(self) -> bool:
        return self.trace is not None


def prepare(loaded: LoadedModel, run_input: RunInput) -> tuple[ChatPrompt, list[int] | None]:
    """The prompt to prefill and, in replay mode, the trace ids to teacher-force.

    A trace that is a transcript (:func:`~thinkviz.text.transcript.is_transcript`) is replayed as a
    conversation; one that starts with an assistant or tool message continues the system
    prompt and question given, one with its own system or user message stands alone.
    """
    trace = run_input.trace or ""
    if not (run_input.replay and is_transcript(trace)) and not run_input.question.strip():
        raise RunInputError("The question is empty: type a prompt or pick a preset.")
    try:
        if run_input.replay:
            return prepare_replay(
                loaded, trace_from_text(trace, run_input.system, run_input.question), run_input.max_tokens
            )
        reasoning = reasoning_format(loaded.tokenizer, enable_thinking=run_input.enable_thinking)
        return build_chat(loaded.tokenizer, run_input.system, run_input.question, reasoning=reasoning), None
    except TraceError as exc:
        raise RunInputError(str(exc)) from None


def run_input(
    mode: str,
    system: str | None,
    question: str | None,
    trace: str | None,
    max_tokens: Any = None,
    enable_thinking: Any = True,
) -> RunInput:
    """The :class:`RunInput` the controls describe (an empty system box sends no system prompt;
    ``max_tokens`` 0 or ``None``: the whole trace; ``enable_thinking``: Qwen3's switch)."""
    if mode not in RUN_MODES:
        raise RunInputError(f"Unknown run mode {mode!r}; choose generate or replay.")
    if mode == "replay" and not (trace or "").strip():
        raise RunInputError(
            "Replay mode needs a trace: pick a replay preset, paste the assistant's text or a "
            "transcript, or upload one."
        )
    try:
        limit = int(max_tokens or 0)
    except (TypeError, ValueError):
        raise RunInputError(f"The trace tokens to replay must be a whole number, got {max_tokens!r}.") from None
    if limit < 0:
        raise RunInputError(f"The trace tokens to replay cannot be negative, got {limit}.")
    return RunInput(
        system=(system or "").strip() or None,
        question=question or "",
        trace=trace if mode == "replay" else None,
        max_tokens=limit or None,
        enable_thinking=enable_thinking is None or bool(enable_thinking),
    )


def decode_settings(max_new_tokens: Any, temperature: Any, stop_at_eos: Any = True) -> DecodeSettings:
    """Validated decode settings (greedy when ``temperature`` is 0)."""
    try:
        settings = DecodeSettings(
            max_new_tokens=int(max_new_tokens), temperature=float(temperature), stop_at_eos=bool(stop_at_eos)
        )
        settings.validate()
    except (TypeError, ValueError) as exc:  # EngineError is a ValueError
        raise RunInputError(str(exc) if isinstance(exc, EngineError) else f"Bad decode setting: {exc}") from None
    return settings
