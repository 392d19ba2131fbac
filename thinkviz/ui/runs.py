"""Starting runs from what the user typed.

Shared by the Live and Compare tabs: a :class:`RunInput` is a chat (system prompt +
question) and, in replay mode, the assistant text — or a transcript — to teacher-force
instead of generating.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..chat import ChatPrompt, build_chat
from ..model import LoadedModel
from ..replay import TraceError, trace_from_text
from ..replay import prepare as prepare_replay
from ..transcript import is_transcript


class RunInputError(ValueError):
    """The input cannot be run; the message is shown to the user as is."""


@dataclass(frozen=True)
class RunInput:
    """A chat to run; ``trace`` (assistant text) switches from generating to replaying it, and
    ``max_tokens`` replays only its first tokens (a quick look at a long trace)."""

    system: str | None
    question: str
    trace: str | None = None
    max_tokens: int | None = None

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
            return prepare_replay(
                loaded, trace_from_text(trace, run_input.system, run_input.question), run_input.max_tokens
            )
        return build_chat(loaded.tokenizer, run_input.system, run_input.question), None
    except TraceError as exc:
        raise RunInputError(str(exc)) from None
