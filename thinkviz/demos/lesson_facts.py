"""What a lesson reads from a recording: its runs, the named moments and the numbers its narration quotes.

A lesson step looks at one run of a preset's recording (:class:`RunAt`) at one frame, an event
index of that run.  A frame is a number or a named moment (:data:`MOMENTS`), found in the run's
own data; a narration's numbers are placeholders (:data:`QUANTITIES`) filled from the same data,
so a preset recorded again cannot leave a lesson quoting old numbers.  Nothing here needs a model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..core.events import RunRecord
from ..measure.metrics import TokenFidelity, divergence_step
from ..memory import Projection
from .recordings import LIVE_KEY, Recording

MIB = 2**20


class FactError(ValueError):
    """A moment or a number a lesson names cannot be read from its recording (one line)."""


@dataclass(frozen=True)
class RunAt:
    """Run ``index`` of ``recording`` (its label ``label``), with ``projection`` for the card moments."""

    recording: Recording
    index: int
    label: str
    projection: Projection | None = None

    @property
    def record(self) -> RunRecord:
        return self.recording.records[self.index]

    @property
    def frames(self) -> int:
        return len(self.record.events)

    def seen(self) -> np.ndarray:
        """``(frames,)`` tokens seen after each event (prompt included)."""
        record = self.record
        counts = np.array([len(e.token_ids) for e in record.events], dtype=np.int64)
        return len(record.prompt_ids) + np.cumsum(counts)

    def fidelity(self) -> TokenFidelity | None:
        """The run's per-token fidelity against the full cache (``None``: not measured)."""
        found = self.recording.fidelity.get(str(self.index))
        if found is None and self.index == self.recording.live:
            found = self.recording.fidelity.get(LIVE_KEY)
        return found

    def frame_of(self, position: int) -> int:
        """The first frame whose tokens include ``position``."""
        return int(min(np.searchsorted(self.seen(), position, side="right"), self.frames - 1))


def run_labels(recording: Recording) -> list[str]:
    """A label for every run of ``recording``: the columns', then Live's run (its policy) and the
    reference's ("full cache") when they are stored apart."""
    labels = list(recording.labels)
    for index in range(len(labels), len(recording.records)):
        policy = str(recording.records[index].meta.get("policy"))
        labels.append("full cache" if index == recording.reference else policy)
    return labels


# ---- moments ------------------------------------------------------------------------------------
def _first(hits: np.ndarray) -> int | None:
    found = np.flatnonzero(hits)
    return int(found[0]) if found.size else None


def first_eviction(run: RunAt) -> int | None:
    return _first(np.array([bool(e.evicted) for e in run.record.events]))


def budget_reached(run: RunAt) -> int | None:
    budget = run.record.meta.get("budget")
    return None if budget is None else _first(np.array([e.kv_tokens >= budget for e in run.record.events]))


def divergence_position(run: RunAt) -> int | None:
    """The first token where the run parts from the full cache: in a generation the first token it
    wrote differently; in a replay (the same text for both) the first token, from the run's first
    eviction on, whose most likely next token differs from the full cache's (before any eviction
    the two caches are the same and a flip is rounding between near-ties)."""
    recording, record = run.recording, run.record
    reference = recording.reference
    if recording.mode == "generate" and reference is not None and reference != run.index:
        full = recording.records[reference]
        step = divergence_step(full.token_ids[len(full.prompt_ids) :], record.token_ids[len(record.prompt_ids) :])
        return None if step is None else len(record.prompt_ids) + step
    fidelity, evicts = run.fidelity(), first_eviction(run)
    if fidelity is None or evicts is None:
        return None
    start = run.seen()[evicts - 1] if evicts > 0 else len(record.prompt_ids)
    hit = _first((~fidelity.top1) & (fidelity.positions >= start))
    return None if hit is None else int(fidelity.positions[hit])


def divergence(run: RunAt) -> int | None:
    position = divergence_position(run)
    return None if position is None else run.frame_of(position)


def out_of_memory(run: RunAt) -> int | None:
    """The first frame at which the full cache of the tokens seen, priced on the step's card, outgrows it."""
    if run.projection is None:
        return None
    return _first(run.projection.kv_bytes(run.seen()) > run.projection.available_bytes)


def block_dropped(run: RunAt) -> int | None:
    """The first frame at which a whole think block has left the cache (think_drop)."""
    return _first(np.array([any(b.get("evicted") for b in e.info.get("blocks", ())) for e in run.record.events]))


MOMENTS: dict[str, Callable[[RunAt], int | None]] = {
    "start": lambda run: 0,
    "end": lambda run: run.frames - 1,
    "first eviction": first_eviction,
    "budget reached": budget_reached,
    "divergence from the full cache": divergence,
    "out of memory on the card": out_of_memory,
    "first think block dropped": block_dropped,
}


def moment_frame(run: RunAt, moment: str) -> int:
    """The frame of ``moment`` in ``run``; :class:`FactError` if it is unknown or never happens."""
    find = MOMENTS.get(moment)
    if find is None:
        raise FactError(f"unknown moment {moment!r}; use a step number or one of: {', '.join(MOMENTS)}")
    if moment == "out of memory on the card" and run.projection is None:
        raise FactError(f"moment {moment!r} needs a card (card: {{model: …, gb: …}})")
    frame = find(run) if run.frames else None
    if frame is None:
        raise FactError(f"moment {moment!r} is not found in run {run.label!r} of {run.recording.preset}")
    return frame


# ---- numbers ------------------------------------------------------------------------------------
def _fidelity_upto(run: RunAt, frame: int) -> TokenFidelity:
    fidelity = run.fidelity()
    if fidelity is None or not len(fidelity.positions):
        raise FactError(f"run {run.label!r} has no fidelity measured against the full cache")
    shown = fidelity.first(int(np.searchsorted(fidelity.positions, run.seen()[frame])))
    if not len(shown.positions):
        raise FactError(f"run {run.label!r} has no fidelity measured by this frame")
    return shown


def _event(run: RunAt, frame: int):
    return run.record.events[frame]


def _card(run: RunAt) -> Projection:
    if run.projection is None:
        raise FactError("this number needs a card (card: {model: …, gb: …})")
    return run.projection


def _divergence_at(run: RunAt, frame: int) -> int:
    position = divergence_position(run)
    if position is None:
        raise FactError(f"run {run.label!r} never parts from the full cache")
    return position


def _blocks(run: RunAt, frame: int) -> list[dict]:
    return list(_event(run, frame).info.get("blocks", ()))


Number = int | float | str
QUANTITIES: dict[str, tuple[str, Callable[[RunAt, int], Number]]] = {
    "step": ("the frame's step number", lambda run, f: _event(run, f).step),
    "steps": ("the run's number of steps", lambda run, f: run.frames),
    "tokens": ("tokens seen by the frame (prompt included)", lambda run, f: int(run.seen()[f])),
    "prompt_tokens": ("tokens of the prompt", lambda run, f: len(run.record.prompt_ids)),
    "new_tokens": (
        "tokens after the prompt by the frame",
        lambda run, f: int(run.seen()[f]) - len(run.record.prompt_ids),
    ),
    "kv_tokens": ("tokens the cache holds per layer and kv-head", lambda run, f: _event(run, f).kv_tokens),
    "evicted": (
        "tokens seen that the cache no longer holds",
        lambda run, f: int(run.seen()[f]) - _event(run, f).kv_tokens,
    ),
    "budget": ("the run's budget (tokens per layer and kv-head)", lambda run, f: run.record.meta["budget"]),
    "over_budget": (
        "tokens the cache holds beyond its budget (0 within it)",
        lambda run, f: max(0, _event(run, f).kv_tokens - int(run.record.meta["budget"])),
    ),
    "layers": ("the recorded model's layers", lambda run, f: int(run.record.meta["geometry"]["layers"])),
    "kv_heads": ("its kv-heads per layer", lambda run, f: int(run.record.meta["geometry"]["kv_heads"])),
    "kv_mib": ("MiB the cache holds", lambda run, f: round(_event(run, f).kv_bytes / MIB, 1)),
    "full_kv_mib": ("MiB the full cache would hold", lambda run, f: round(_event(run, f).full_kv_bytes / MIB, 1)),
    "kib_per_token": (
        "KiB of keys and values per token (full cache)",
        lambda run, f: round(_event(run, f).full_kv_bytes / int(run.seen()[f]) / 1024, 1),
    ),
    "saved_pct": (
        "percent of the full cache's memory saved",
        lambda run, f: round(100 * (1 - _event(run, f).kv_bytes / _event(run, f).full_kv_bytes)),
    ),
    "delta_nll": (
        "mean ΔNLL per token vs the full cache (nats)",
        lambda run, f: round(float(np.nanmean(_fidelity_upto(run, f).nll - _fidelity_upto(run, f).nll_full)), 3),
    ),
    "kl": (
        "mean KL(full ‖ run) per token (nats)",
        lambda run, f: round(float(np.nanmean(_fidelity_upto(run, f).kl)), 3),
    ),
    "top1_pct": (
        "percent of tokens whose most likely next token is the full cache's",
        lambda run, f: round(100 * float(np.mean(_fidelity_upto(run, f).top1)), 1),
    ),
    "divergence": ("the token where the run first parts from the full cache", _divergence_at),
    "blocks_dropped": (
        "think blocks dropped whole by the frame (think_drop)",
        lambda run, f: sum(bool(b.get("evicted")) for b in _blocks(run, f)),
    ),
    "card_model": ("the model the card's projection prices", lambda run, f: _card(run).target.name),
    "card_gb": ("the card's memory (GiB)", lambda run, f: f"{_card(run).card_gb:g}"),
    "card_tokens": ("tokens of full cache that fit beside the weights", lambda run, f: _card(run).max_tokens),
    "card_weights_gib": ("GiB the card's weights take", lambda run, f: round(_card(run).weights_bytes / 2**30, 1)),
}
PREFIXED = {
    "params.": "a knob of the run's policy (params.n_sink)",
    "info.": "a number the policy reported at the frame (info.segments)",
    "count.": "segments of a kind in the run (count.think)",
}


def quantity(run: RunAt, frame: int, name: str) -> Number:
    """Number ``name`` of ``run`` at ``frame``; :class:`FactError` if it is unknown or undefined there."""
    if name in QUANTITIES:
        try:
            value = QUANTITIES[name][1](run, frame)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise FactError(f"{name!r} cannot be read from run {run.label!r} ({type(exc).__name__}: {exc})") from None
    elif name.startswith("params."):
        value = run.record.meta.get("params", {}).get(name[len("params.") :])
    elif name.startswith("info."):
        value = _event(run, frame).info.get(name[len("info.") :])
    elif name.startswith("count."):
        value = sum(span["kind"] == name[len("count.") :] for span in run.record.segments)
    else:
        known = ", ".join([*QUANTITIES, *(f"{p}…" for p in PREFIXED)])
        raise FactError(f"unknown number {name!r}; use one of: {known}")
    if value is None or isinstance(value, (bool, dict, list)) or (isinstance(value, float) and value != value):
        raise FactError(f"{name!r} has no value in run {run.label!r} at step {frame}")
    return value


def number_text(value: Number) -> str:
    """A number as a narration shows it (thousands separated)."""
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 10 else f"{value:,.1f}".rstrip("0").rstrip(".")
    return str(value)
