"""A run a script asks for by name: a policy and a JSON object of its knobs, on a chat or a preset.

The Live tab's ``/run_policy`` endpoint takes what :func:`script_request` does.  The policy is
built by :func:`~thinkviz.ui.controls.policy_from_knobs`, which ends where the Live controls'
values end (:func:`~thinkviz.ui.controls.build_policy`), so a knob is checked the same way
whichever way it comes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping

from ..policies import Policy
from ..measure.requests import RunInput, run_input
from .controls import json_knobs, policy_from_knobs
from .inputs import choose_preset
from .live_run import LiveFrame


@dataclass(frozen=True)
class ScriptRequest:
    """The policy to run, the chat to run it on and the new-token limit."""

    policy: Policy
    run_input: RunInput
    max_new_tokens: Any


def script_request(
    policy: str | None, knobs: str | None, preset: str | None, chat: Mapping[str, Any], max_new_tokens: Any
) -> ScriptRequest:
    """What ``/run_policy`` runs.

    Without ``preset``: policy ``policy`` with ``knobs`` (a JSON object by knob name) on ``chat``
    (the chat controls' values by API name: ``run_mode``, ``system``, ``question``, ``trace``).
    With ``preset`` (a name from ``presets/``): the preset's chat, trace, run mode and new-token
    limit (``chat`` and ``max_new_tokens`` are not used), its policy unless ``policy`` names
    another, and its knobs (when its policy runs) with ``knobs`` over them.  Raises
    :class:`~thinkviz.ui.controls.ControlError` or :class:`~thinkviz.measure.requests.RunInputError`
    with the reason.
    """
    given = json_knobs(knobs)
    name = (policy or "").strip()
    if not (preset or "").strip():
        asked = run_input(chat["run_mode"], chat["system"], chat["question"], chat["trace"])
        return ScriptRequest(policy_from_knobs(name, given), asked, max_new_tokens)
    choice = choose_preset(preset.strip())
    chosen = choice.preset
    name = name or chosen.policy
    merged = {**chosen.params, **given} if name == chosen.policy else given
    return ScriptRequest(
        policy_from_knobs(name, merged),
        run_input(chosen.mode, choice.system, chosen.question, choice.trace),
        chosen.max_new_tokens,
    )


def run_summary(label: str, frame: LiveFrame) -> dict[str, Any]:
    """What ``/run_policy`` returns besides the recording: the run's label in Explore, its status
    line, the policy and knobs it ran with, the tokens it added and the engine's summary."""
    record = frame.record
    overview = {
        "run": label,
        "status": frame.status,
        "policy": record.meta.get("policy"),
        "params": record.meta.get("params", {}),
        "new_tokens": sum(len(event.token_ids) for event in record.events),
        "summary": record.summary,
    }
    return json.loads(json.dumps(overview, default=float))  # numpy scalars as plain numbers
