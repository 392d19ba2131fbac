"""Starting runs from what the user typed.

Shared by the Live and Compare tabs: a :class:`RunInput` is a chat (system prompt +
question) and, in replay mode, the assistant text — or a transcript — to teacher-force
instead of generating.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterator

from ..chat import ChatPrompt, build_chat
from ..engine import DecodeSettings, EngineError, Run
from ..events import StepEvent
from ..kvquant import KVQuant
from ..model import LoadedModel
from ..policies import Policy
from ..replay import TraceError, trace_from_text
from ..replay import prepare as prepare_replay
from ..transcript import is_transcript


class RunInputError(ValueError):
    """The input cannot be run; the message is shown to the user as is."""


@dataclass(frozen=True)
class RunInput:
    """A chat to run; ``trace`` (assistant text) switches from generating to replaying it."""

    system: str | None
    question: str
    trace: str | None = None

    @property
    def replay(self) -> bool:
        return self.trace is not None


def prepare(loaded: LoadedModel, run_input: RunInput) -> tuple[ChatPrompt, list[int] | None]:
    """The prompt to prefill and, in replay mode, the trace ids to teacher-force.

    A trace that is a transcript (:func:`~thinkviz.transcript.is_transcript`) is replayed as a
    conversation; one that starts with an assistant or tool message continues the system
    prompt and question given, one with its own system or user message stands alone.
    """
    trace = run_input.trace or ""
    if not (run_input.replay and is_transcript(trace)) and not run_input.question.strip():
        raise RunInputError("The question is empty: type a prompt or pick a preset.")
    try:
        if run_input.replay:
            return prepare_replay(loaded, trace_from_text(trace, run_input.system, run_input.question))
        return build_chat(loaded.tokenizer, run_input.system, run_input.question), None
    except TraceError as exc:
        raise RunInputError(str(exc)) from None


def start_run(
    loaded: LoadedModel,
    policy: Policy,
    run_input: RunInput,
    settings: DecodeSettings,
    cancel: threading.Event,
    kv_quant: KVQuant = KVQuant(),
) -> tuple[Run, Iterator[StepEvent]]:
    """A :class:`~thinkviz.engine.Run` (its cache in ``kv_quant``) and its event stream (generate or replay)."""
    prompt, trace_ids = prepare(loaded, run_input)
    try:
        run = Run(loaded, policy, prompt, settings, cancel, kv_quant)
        events = run.replay(trace_ids) if trace_ids is not None else run.generate()
    except EngineError as exc:
        raise RunInputError(str(exc)) from None
    return run, events
