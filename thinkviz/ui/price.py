"""The price of a run, as the status line says it before the run starts."""

from __future__ import annotations

from ..demos.record import preset_request, recording_problem
from ..measure.comparison import plan
from ..measure.estimate import format_seconds
from ..measure.requests import RunInputError, prepare
from .model_slot import ModelSlot


def preset_estimate(slot: ModelSlot, name: str | None, tab: str, measure: bool = True) -> str | None:
    """The status line once preset ``name`` is picked in ``tab`` (``"live"`` or ``"compare"``): how long
    running it takes on this machine, and whether its recording plays at once (``None`` when no
    usable preset is picked: the preset's own handler says why)."""
    if not name:
        return None
    try:
        request = preset_request(name)
    except RunInputError:
        return None
    recording = (
        "▶ Play recording opens it at once"
        if recording_problem(name) is None
        else "it has no current recording to play"
    )
    loaded, speed = slot.loaded, slot.speed
    if loaded is None or speed is None or not slot.status.ready:
        return f"Preset ready: {recording}; the run's length is estimated once the model has loaded."
    try:
        prompt, trace = prepare(loaded, request.run_input)
    except RunInputError as exc:
        return f"Preset ready, but it cannot run on this model: {exc}"
    columns = [request.live] if tab == "live" else request.columns
    phases = plan(
        columns,
        len(prompt.ids),
        None if trace is None else len(trace),
        request.settings,
        measure=measure or (tab == "compare" and trace is not None),
        reference_run=tab == "compare",
    )
    bound = "" if trace is not None else "at most "
    runs = phases[0].runs
    what = f"{len(trace):,} trace tokens" if trace is not None else f"up to {request.settings.max_new_tokens} tokens"
    return (
        f"Preset ready. Running it live takes {bound}{format_seconds(speed.estimate(phases))} on this machine "
        f"({what}, {runs} run{'s' if runs > 1 else ''} side by side); {recording}."
    )
