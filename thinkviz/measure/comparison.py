"""Runs side by side on one input, driven without drawing anything: Compare's columns, and Live's run with
its full-cache reference.

A :class:`Column` is a policy (with its knobs) and the KV format its cache is stored in, so the same
policy may appear several times ("h2o · recent 32" beside "h2o · recent 128");
:func:`column_labels` names each column by what differs from the others.  :class:`Comparison`
runs the columns and measures their fidelity against the full cache at full precision:

- **replay** with ``measure``: one :class:`~thinkviz.measure.replay.LockstepReplay` of the trace through every
  column and the full cache, chunk by chunk; fidelity grows with every chunk.  Without ``measure``
  the columns replay on their own, one chunk each in turn (Live's plain replay).
- **generate**: every column, and a full-cache run unless a column is one (or ``reference_run`` is
  off), decode together, one token each per step, so they grow together.  Then, with
  ``measure``, the full cache's text (without a full-cache run: the first column's own text) is
  teacher-forced through fresh copies of the evicting columns in lockstep with the full cache.

With ``batched`` (the default) the runs of a step are the rows of one forward pass wherever they
can be (:mod:`thinkviz.core.together`: each row computes what it computes alone; a run that cannot
share the pass says why in ``record.meta["batch"]``).

Iterating drives it one step at a time (a chunk of every run, a round of tokens, a chunk of the
fidelity pass); between steps, ``runs``, ``fidelity``, ``phase``, ``done`` and ``total`` say where it
is.  The app's frames (:mod:`thinkviz.ui.live_run`, :mod:`thinkviz.ui.compare_run`), the preset recorder
and the tests all drive this one class, and a recording plays back through the same attributes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any
from collections.abc import Iterator, Sequence

from ..text.chat import ChatPrompt
from ..core.engine import DecodeSettings, Run
from ..core.together import generate_together, replay_together
from .estimate import Phase
from ..core.kvquant import KVQuant
from .metrics import TokenFidelity
from ..models.loading import LoadedModel
from ..policies import REFERENCE_POLICY, Policy, make_policy, policy_names, policy_params
from ..demos.presets import Preset
from .replay import LockstepReplay
from ..policies.registry import policy_values

MIN_COLUMNS, MAX_COLUMNS = 2, 6


@dataclass(frozen=True)
class Column:
    """One run to compare: a policy with its knobs and the KV format of its cache."""

    policy: Policy
    kv_quant: KVQuant = KVQuant()

    @property
    def is_reference(self) -> bool:
        """The full cache at full precision: the run every other one is measured against."""
        return self.policy.name == REFERENCE_POLICY and not self.kv_quant.spec.quantized

    def fresh(self) -> Column:
        """The same column with a new policy object (policies may keep per-run state)."""
        return Column(make_policy(self.policy.name, **self.policy.config), self.kv_quant)


def _knob_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)


def column_labels(columns: Sequence[Column]) -> list[str]:
    """A title per column: the policy's name, then what sets it apart from the other columns of the
    same policy (``h2o · recent 32``, ``h2o · recent 128``) and its KV format when quantized
    (``full · q4_0``).  Columns that differ in nothing shown get ``#2``, ``#3``."""
    labels = []
    for column in columns:
        same = [c for c in columns if c.policy.name == column.policy.name]
        parts = [column.policy.name]
        if len(same) > 1:
            order = [p.name for p in policy_params(column.policy.name)]
            differ = [key for key in order if len({_knob_text(c.policy.config.get(key)) for c in same}) > 1]
            parts += [f"{key.replace('_', ' ')} {_knob_text(column.policy.config[key])}" for key in differ]
        if column.kv_quant.spec.quantized:
            parts.append(column.kv_quant.label)
        labels.append(" · ".join(parts))
    for label in set(labels):
        clashing = [i for i, text in enumerate(labels) if text == label]
        for n, i in enumerate(clashing[1:], start=2):
            labels[i] = f"{label} #{n}"
    return labels


def plan(
    columns: Sequence[Column],
    prompt_tokens: int,
    trace_tokens: int | None,
    settings: DecodeSettings,
    measure: bool = True,
    reference_run: bool = True,
) -> list[Phase]:
    """The work a :class:`Comparison` of ``columns`` will do, for :mod:`thinkviz.measure.estimate`, before any of
    it runs (``trace_tokens`` ``None``: generate, at most ``max_new_tokens`` each)."""
    interval = columns[0].policy.interval
    references = sum(1 for c in columns if c.is_reference)
    evicting = len(columns) - references
    if trace_tokens is not None:
        runs = evicting + 1 if measure else len(columns)
        return [Phase("replay", runs, prompt_tokens, trace_tokens, rows=interval)]
    decoding = len(columns) + (1 if reference_run and not references else 0)
    phases = [Phase("generate", decoding, prompt_tokens, settings.max_new_tokens)]
    if measure and evicting:
        phases.append(Phase("fidelity", evicting + 1, prompt_tokens, settings.max_new_tokens, rows=interval))
    return phases


class Comparison:
    """``columns`` on one prompt (and, to replay, ``trace_ids``), stepped by iterating.

    The runs are made at once (nothing runs the model before the first step), so their records
    (the prompt) can be shown while the first step prefills.  Attributes, current between steps:
    ``runs`` (one :class:`~thinkviz.core.engine.Run` per column), ``reference`` (the full-cache run, or
    ``None`` without one), ``fidelity`` (per column index, the
    :class:`~thinkviz.measure.metrics.TokenFidelity` measured so far; the reference's own under ``None``),
    ``phase`` (``"prefill"``, ``"replay"``, ``"generate"`` or ``"fidelity"``), ``done`` and ``total``
    (tokens of the phase), ``fidelity_text`` (the ids the fidelity pass teacher-forces).
    Raises :class:`~thinkviz.core.engine.EngineError` for a request the model cannot run.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        columns: Sequence[Column],
        prompt: ChatPrompt,
        trace_ids: Sequence[int] | None,
        settings: DecodeSettings,
        cancel: threading.Event | None = None,
        measure: bool = True,
        reference_run: bool = True,
        batched: bool = True,
    ) -> None:
        if not columns:
            raise ValueError("a comparison needs at least one column")
        self.loaded, self.columns, self.prompt, self.settings = loaded, list(columns), prompt, settings
        self.trace_ids = None if trace_ids is None else [int(i) for i in trace_ids]
        self.cancel = cancel or threading.Event()
        self.measure, self.batched = measure, batched
        self.labels = column_labels(self.columns)
        self.interval = self.columns[0].policy.interval
        self.references = [i for i, c in enumerate(self.columns) if c.is_reference]
        self.reference: Run | None = None
        self.fidelity: dict[int | None, TokenFidelity] = {}
        self.fidelity_text: list[int] = []
        self.phase, self.done = "prefill", 0
        self.total = len(self.trace_ids) if self.replay else settings.max_new_tokens
        self._lockstep: LockstepReplay | None = None
        if self.replay and measure:
            self._lockstep = self._in_lockstep(
                [self.columns[i] for i in self.evicting], self.trace_ids, replace(settings, scoring=True)
            )
            by_column = dict(zip(self.evicting, self._lockstep.runs))
            self.reference = self._lockstep.reference
            self.runs = [by_column.get(i, self._lockstep.reference) for i in range(len(self.columns))]
            self.fidelity_text = self.trace_ids
            return
        self.runs = [Run(loaded, c.policy, prompt, settings, self.cancel, c.kv_quant) for c in self.columns]
        if self.references:
            self.reference = self.runs[self.references[0]]
        elif reference_run and not self.replay:
            full = make_policy(REFERENCE_POLICY, interval=self.interval)
            self.reference = Run(loaded, full, prompt, settings, self.cancel)

    @property
    def replay(self) -> bool:
        return self.trace_ids is not None

    @property
    def evicting(self) -> list[int]:
        """Indices of the columns measured against the reference (all but the reference's own)."""
        return [i for i in range(len(self.columns)) if i not in self.references]

    def plan(self, finished: bool = False) -> list[Phase]:
        """The work of this comparison (``finished``: what it did, a generation as long as it went)."""
        phases = plan(
            self.columns,
            len(self.prompt.ids),
            None if not self.replay else len(self.trace_ids),
            self.settings,
            self.measure,
            self.reference is not None,
        )
        if finished and not self.replay:
            made = max((len(r.record.events) for r in self.runs), default=0)
            done = [replace(phases[0], tokens=made)]
            if self.phase == "fidelity":
                done.append(replace(phases[1], tokens=len(self.fidelity_text)))
            phases = done
        return phases

    def __iter__(self) -> Iterator[Comparison]:
        if self._lockstep is not None:
            yield from self._lockstep_replay()
        elif self.replay:
            yield from self._plain_replay()
        else:
            yield from self._generate()

    # ---- the phases ----------------------------------------------------------------------------
    def _in_lockstep(self, columns: Sequence[Column], ids: list[int], settings: DecodeSettings) -> LockstepReplay:
        """The evicting ``columns`` (in :attr:`evicting` order) and the full cache in lockstep over ``ids``;
        :attr:`fidelity` then follows its measurements."""
        lockstep = LockstepReplay(
            self.loaded,
            [c.policy for c in columns],
            self.prompt,
            ids,
            settings,
            self.cancel,
            kv_quants=[c.kv_quant for c in columns],
            batched=self.batched,
        )
        self.fidelity = {i: f for i, f in zip(self.evicting, lockstep.fidelity)}
        self.fidelity[None] = lockstep.reference_fidelity
        for i in self.references:
            self.fidelity[i] = lockstep.reference_fidelity
        return lockstep

    def _lockstep_replay(self) -> Iterator[Comparison]:
        self.phase = "replay"
        for done in self._lockstep:
            self.done = done
            yield self

    def _plain_replay(self) -> Iterator[Comparison]:
        self.phase = "replay"
        for events in replay_together(self.runs, self.trace_ids, batched=self.batched):  # the same chunks
            self.done = max(e.positions[-1] for e in events if e is not None) + 1 - len(self.prompt.ids)
            yield self

    def _generate(self) -> Iterator[Comparison]:
        everyone = self.runs + ([self.reference] if self.reference is not None and not self.references else [])
        self.phase = "generate"
        for _ in generate_together(everyone, batched=self.batched):  # one token of every run: they grow together
            self.done = max(len(run.record.events) for run in everyone)
            yield self
        source = self.reference or self.runs[0]
        self.fidelity_text = [t for e in source.record.events for t in e.token_ids]
        if not self.measure or self.cancel.is_set() or not self.fidelity_text or not self.evicting:
            return
        self.phase, self.done, self.total = "fidelity", 0, len(self.fidelity_text)
        lockstep = self._in_lockstep(
            [self.columns[i].fresh() for i in self.evicting], self.fidelity_text, replace(self.settings, scoring=False)
        )
        yield self
        for done in lockstep:
            self.done = done
            yield self


def preset_policies(preset: Preset) -> tuple[list[str], list[KVQuant], list[str]]:
    """The policies a preset compares (its ``compare`` list, else the full cache and its policy in
    its KV format): ``(registered ones, at most MAX_COLUMNS; their KV formats; those left out)``."""
    if preset.compare:
        wanted = list(zip(preset.compare, preset.compare_kv))
    else:
        wanted = [(REFERENCE_POLICY, KVQuant()), (preset.policy, preset.kv_quant)]
    known = [(name, kv) for name, kv in wanted if name in policy_names()][:MAX_COLUMNS]
    left_out = [name for name, _ in wanted if name not in {n for n, _ in known}]
    return [name for name, _ in known], [kv for _, kv in known], left_out


def preset_columns(preset: Preset) -> list[Column]:
    """The columns the Compare tab runs for a preset: each of :func:`preset_policies` in its KV format,
    with the preset's knobs that policy declares."""
    names, formats, _ = preset_policies(preset)
    return [Column(make_policy(name, **policy_values(name, preset.params)), kv) for name, kv in zip(names, formats)]


def live_column(preset: Preset) -> Column:
    """The column Live runs for a preset: its policy with all its knobs, in its KV format."""
    return Column(make_policy(preset.policy, **preset.params), preset.kv_quant)
