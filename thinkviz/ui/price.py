"""The price of a run, as the status line says it before the run starts.

Live and Compare price the run their controls describe (:func:`price_line`, with the :class:`Work`
a tab builds from its values), the Sweep tab the sweep its controls describe (:func:`sweep_price`):
what the request plans (:func:`~thinkviz.measure.comparison.plan`: runs side by side, prompt and
trace tokens, tokens per forward) priced by the machine's :class:`~thinkviz.measure.estimate.Speed`.
That speed is measured once the model has loaded and corrected by every run that finished
(:meth:`~thinkviz.measure.estimate.Speed.learn`), so the error of one estimate is folded into the
next price.  Each tab re-prices on any change of a control that changes the work (one listener
over them all: :func:`~thinkviz.ui.handlers.wire_price`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.engine import DecodeSettings
from ..demos.record import recording_problem
from ..measure.comparison import Column, plan
from ..measure.estimate import Phase, Speed, format_seconds
from ..measure.replay import TraceError
from ..measure.replay import prepare as prepare_replay
from ..measure.requests import RunInput, RunInputError, prepare
from ..sweep.grid import vary_grid
from .controls import ControlError
from .model_slot import ModelSlot
from .sweep_run import SweepRequest
from .text import no_markup

LOADING = "the run's length is estimated once the model has loaded"
BAD_INPUTS = (ControlError, RunInputError, TraceError, ValueError)  # what a half-set control raises


@dataclass(frozen=True)
class Work:
    """What a Live or Compare run does, as its tab's controls describe it (see :func:`plan`)."""

    columns: Sequence[Column]
    run_input: RunInput
    settings: DecodeSettings
    measure: bool
    reference_run: bool


def recording_note(preset: str | None) -> str:
    """What ``preset``'s recording offers (``""`` when no preset is picked)."""
    if not preset:
        return ""
    if recording_problem(preset) is None:
        return "▶ Play recording plays the preset at once, no model needed"
    return "this preset has no current recording to play"


def joined(*parts: str) -> str:
    """The non-empty ``parts`` as one status line (a part's own closing full stop dropped: one ends the line)."""
    text = "; ".join(part.rstrip(".") for part in parts if part)
    return text[:1].upper() + text[1:] + "." if text else ""


def learnt(speed: Speed) -> str:
    """How far the finished runs corrected the calibration (``""``: not noticeably)."""
    if abs(speed.correction - 1.0) < 0.05:
        return ""
    return f", corrected ×{speed.correction:.2f} by the runs so far"


def priced(speed: Speed, phases: Sequence[Phase], what: str, bound: bool, subject: str = "running this") -> str:
    runs = max(phase.runs for phase in phases)
    side = f"{runs} run{'s' if runs > 1 else ''} side by side"
    at_most = "at most " if bound else ""
    return (
        f"{subject} takes {at_most}{format_seconds(speed.estimate(phases))} on this machine "
        f"({what}, {side}{learnt(speed)})"
    )


def work_price(slot: ModelSlot, work: Work) -> str:
    """The price of ``work`` on the loaded model (:data:`LOADING` before it has loaded); raises
    :class:`RunInputError` for input the model cannot run."""
    loaded, speed = slot.loaded, slot.speed
    if loaded is None or speed is None or not slot.status.ready:
        return LOADING
    prompt, trace = prepare(loaded, work.run_input)
    phases = plan(
        work.columns,
        len(prompt.ids),
        None if trace is None else len(trace),
        work.settings,
        measure=work.measure,
        reference_run=work.reference_run,
    )
    if trace is not None:
        what = f"{len(trace):,} trace tokens after a {len(prompt.ids):,}-token prompt"
    else:
        what = f"up to {work.settings.max_new_tokens:,} new tokens after a {len(prompt.ids):,}-token prompt"
    return priced(speed, phases, what, bound=trace is None)


def price_line(slot: ModelSlot, work: Callable[[], Work], preset: str | None = None) -> str:
    """The status line before a run: what the run ``work()`` describes takes here, or why it cannot
    run as set; and what the picked ``preset``'s recording offers.  Never raises."""
    try:
        text = work_price(slot, work())
    except BAD_INPUTS as exc:
        text = f"not ready to run: {no_markup(str(exc))}"
    return joined(text, recording_note(preset))


def sweep_phases(slot: ModelSlot, request: SweepRequest) -> tuple[list[Phase], int, int]:
    """The phases of ``request`` (one lockstep group per budget: the full cache and every policy
    variant), its prompt and trace tokens on the loaded model."""
    prompt, ids = prepare_replay(slot.loaded, request.trace, request.max_trace_tokens)
    variants = sum(len(vary_grid(name, request.vary)) for name in request.policies)
    phases = [
        Phase(f"budget {budget.label}", variants + 1, len(prompt.ids), len(ids), rows=request.interval)
        for budget in request.budgets
    ]
    return phases, len(prompt.ids), len(ids)


def sweep_price(slot: ModelSlot, request: Callable[[], SweepRequest]) -> str:
    """The Sweep tab's status line before a sweep: how long the sweep its controls describe takes
    here (one lockstep group after another), or why it cannot run as set.  Never raises."""
    try:
        asked = request()
        if slot.loaded is None or slot.speed is None or not slot.status.ready:
            return joined(LOADING)
        phases, prompt, trace = sweep_phases(slot, asked)
    except BAD_INPUTS as exc:
        return joined(f"not ready to sweep: {no_markup(str(exc))}")
    speed = slot.speed
    groups = f"{len(phases)} group{'s' if len(phases) > 1 else ''} one after another"
    what = f"{trace:,} trace tokens after a {prompt:,}-token prompt, {groups}"
    return joined(priced(speed, phases, what, bound=False, subject="this sweep"))
