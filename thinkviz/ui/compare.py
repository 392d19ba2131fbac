"""The Compare tab: 2–6 policies on the same input, streamed side by side, with fidelity.

A column is a policy and the KV format its cache is stored in, so "h2o at 25 %, full
precision" can stand beside "the full cache in q4_0"; fidelity is always measured against
the full cache at full precision (a ``full`` column in a quantized format is compared, not
the reference).

Generate mode runs every policy and a full-cache reference round-robin, one token each in
turn, so the columns grow together; the fidelity table reports the step at which each
greedy text first leaves the full cache's.  Then (optionally) the full cache's text is
teacher-forced through fresh copies of the policies in lockstep
(:class:`~thinkviz.replay.LockstepReplay`) to measure NLL, KL and top-1 agreement against
the full cache on the same tokens.  Replay mode is one lockstep replay from the start: the
columns stream and the fidelity table fills in as they go.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..engine import DecodeSettings, EngineError, Run
from ..events import RunRecord
from ..faults import guard_frames
from ..kvquant import KVQuant
from ..metrics import TokenFidelity, divergence_step, summarize
from ..model import LoadedModel
from ..policies import REFERENCE_POLICY, Policy, make_policy, policy_names
from ..presets import Preset
from ..replay import LockstepReplay
from ..units import format_bytes
from ..viz.fidelity import fidelity_figure
from ..viz.figures import compare_memory_figure, series_styles
from ..viz.tables import stats_html
from ..viz.legend import view_legend
from ..viz.tokens import TokenData, token_view
from .runs import RunInput, RunInputError, prepare
from .stream import TokenChannel
from .throttle import FIGURE_INTERVAL, FramePacer

MIN_POLICIES, MAX_POLICIES = 2, 6
FIDELITY_COLUMNS = ["policy", "NLL (nats)", "ΔNLL vs full", "KL(full‖policy)", "top-1 agree", "diverges at step",
                    "peak KV", "kept"]


@dataclass
class CompareFrame:
    """One screen update: a patch message and a header per column, the overlay (``None``:
    unchanged), the fidelity table."""

    status: str
    messages: list[dict[str, Any]]  # one token-view patch per column
    bus: list[dict[str, Any]]  # what to send: each column's recent patches (see stream)
    headers: list[str]
    legend: str  # the strip over the columns (cache, segments, boxes); each header explains its own heat
    figure: Any | None
    table: list[list[Any]]  # one row per policy, every column of FIDELITY_COLUMNS (None: not measured here)
    records: dict[str, RunRecord]
    views: list[TokenData]
    done: bool = False
    fidelity: Any | None = None  # the per-token ΔNLL / KL figure (None: unchanged, or nothing measured yet)

    @property
    def shown_table(self) -> dict[str, list]:
        """The table as the tab shows it: without a column no row has (a replay has no divergence step)."""
        keep = [i for i, _ in enumerate(FIDELITY_COLUMNS) if any(row[i] is not None for row in self.table)]
        return {"headers": [FIDELITY_COLUMNS[i] for i in keep], "data": [[row[i] for i in keep] for row in self.table]}


def column_label(name: str, kv_quant: KVQuant) -> str:
    """A column's title: the policy, and its KV format when quantized (``full · q4_0``)."""
    return name if not kv_quant.spec.quantized else f"{name} · {kv_quant.label}"


def _formats(policies: Sequence[Policy], kv_quants: Sequence[KVQuant] | None) -> list[KVQuant]:
    kv_quants = list(kv_quants) if kv_quants is not None else [KVQuant()] * len(policies)
    if len(kv_quants) != len(policies):
        raise ValueError(f"{len(policies)} policies but {len(kv_quants)} KV formats")
    return kv_quants


def _is_reference(policy: Policy, kv_quant: KVQuant) -> bool:
    return policy.name == REFERENCE_POLICY and not kv_quant.spec.quantized


def check_policies(policies: Sequence[Policy], kv_quants: Sequence[KVQuant] | None = None) -> None:
    """:class:`RunInputError` unless there are 2–6 distinct (policy, KV format) columns sharing one interval."""
    names = [column_label(p.name, kv) for p, kv in zip(policies, _formats(policies, kv_quants))]
    if not MIN_POLICIES <= len(names) <= MAX_POLICIES:
        raise RunInputError(f"Choose between {MIN_POLICIES} and {MAX_POLICIES} policies to compare (got {len(names)}).")
    if len(set(names)) != len(names):
        raise RunInputError("Each policy can be compared once (in each KV format).")
    if len({p.interval for p in policies}) > 1:
        raise RunInputError("Policies compared together must share one interval.")


def preset_columns(preset: Preset) -> tuple[list[str], list[KVQuant], list[str]]:
    """The columns a preset compares (its ``compare`` list, else the full cache and its policy in
    its KV format): ``(registered policies, at most MAX_POLICIES; their KV formats; those left out)``."""
    if preset.compare:
        wanted = list(zip(preset.compare, preset.compare_kv))
    else:
        wanted = [(REFERENCE_POLICY, KVQuant()), (preset.policy, preset.kv_quant)]
    known = [(name, kv) for name, kv in wanted if name in policy_names()][:MAX_POLICIES]
    left_out = [name for name, _ in wanted if name not in {n for n, _ in known}]
    return [name for name, _ in known], [kv for _, kv in known], left_out


def fidelity_row(name: str, fidelity: TokenFidelity | None, diverged: str | None, record: RunRecord) -> list[Any]:
    """One table row: mean NLL, ΔNLL, KL, top-1 (``—`` until measured), divergence (``None`` in a
    replay, where every run reads the same tokens), peak KV, kept share."""

    def number(value: float, fmt: str) -> str:
        return "—" if not np.isfinite(value) else format(value, fmt)

    last = record.events[-1] if record.events else None
    kept = f"{last.kv_tokens / (last.positions[-1] + 1):.0%}" if last else "—"
    peak = format_bytes(max(e.kv_bytes for e in record.events)) if last else "—"
    if fidelity is None or len(fidelity.positions) == 0:
        cells = ["—"] * 4
    else:
        s = summarize(fidelity)
        cells = [number(s["nll"], ".3f"), number(s["nll_delta"], "+.3f"), number(s["kl"], ".4f"),
                 number(s["top1"], ".1%")]
    return [name, *cells, diverged, peak, kept]


def column_views(mode: str, records: dict[str, RunRecord], views: Sequence[TokenData]) -> tuple[str, list[str]]:
    """The legend over the columns (what the view draws besides heat) and one header per column:
    the column's title (the policy, and its KV format when quantized), the policy's heat legend (or
    why it has none) and its stats strip."""
    headers = [f"<div class='tv-col-title'>{name}</div>"
               f"{view_legend(mode, record.meta.get('policy', name), view, ('heat',), compact=True)}"
               f"{stats_html(record)}" for (name, record), view in zip(records.items(), views)]
    widest = max(views, key=lambda v: len(v.texts), default=None)
    return view_legend(mode, "", widest, parts=("keep", "segments", "boxes")), headers


class _Columns:
    """The runs shown as columns, in the user's order, each with its token channel."""

    def __init__(self, names: list[str], runs: list[Run], channels: Sequence[TokenChannel]) -> None:
        self.names, self.runs, self.channels = names, runs, list(channels[: len(names)])
        self.figure_pacer = FramePacer(FIGURE_INTERVAL)

    def frame(self, status: str, table: list[list[Any]], done: bool = False,
              fidelity: Mapping[str, TokenFidelity] | None = None, reference: RunRecord | None = None) -> CompareFrame:
        """The columns now; the figures only when due (else ``None``) and at the end.

        ``fidelity``: the per-token fidelity measured so far (by policy name); the full cache's own
        (all zeros) is left out of its figure.  ``reference``: the full-cache run whose segments
        and texts the figure shows.
        """
        views = [token_view(run.record) for run in self.runs]
        messages = [c.message(v, reset=done or not run.record.events)
                    for c, v, run in zip(self.channels, views, self.runs)]
        records = {name: run.record for name, run in zip(self.names, self.runs)}
        legend, headers = column_views(self.channels[0].mode, records, views)
        due = self.figure_pacer.due() or done
        figure = compare_memory_figure(records) if due else None
        curves = {n: fidelity[n] for n in self.names if fidelity and n in fidelity and n != REFERENCE_POLICY}
        measured = any(len(c.positions) for c in curves.values())
        per_token = fidelity_figure(curves, reference.segments, texts=reference.texts,
                                    styles=series_styles(self.names)) \
            if due and measured and reference is not None else None
        bus = [m for channel in self.channels for m in channel.recent()]
        return CompareFrame(status, messages, bus, headers, legend, figure, table, records, views, done, per_token)


def compare_frames(
    loaded: LoadedModel,
    policies: Sequence[Policy],
    run_input: RunInput,
    settings: DecodeSettings,
    cancel: threading.Event,
    channels: Sequence[TokenChannel],
    measure_fidelity: bool = True,
    pacer: FramePacer | None = None,
    kv_quants: Sequence[KVQuant] | None = None,
) -> Iterator[CompareFrame]:
    """Run ``policies`` side by side on ``run_input``; yield paced frames and a final one.

    ``kv_quants[i]`` is the KV format of column ``i`` (default: full precision everywhere);
    ``channels[i]`` streams column ``i``.  In generate mode with ``measure_fidelity``, a
    second phase teacher-forces the full cache's text through the policies.  Raises
    :class:`RunInputError` for input the model cannot run and
    :class:`~thinkviz.faults.RunFault` when the model or a policy fails mid-run.
    """
    kv_quants = _formats(policies, kv_quants)
    check_policies(policies, kv_quants)
    if len(channels) < len(policies):
        raise ValueError(f"{len(policies)} policies need as many channels, got {len(channels)}")
    pacer = pacer or FramePacer()
    columns = list(zip(policies, kv_quants))
    if run_input.replay:
        frames = _replay_frames(loaded, columns, run_input, settings, cancel, channels, pacer)
    else:
        frames = _generate_frames(loaded, columns, run_input, settings, cancel, channels, measure_fidelity, pacer)
    label = f"the comparison of {', '.join(column_label(p.name, kv) for p, kv in columns)}"
    try:
        yield from guard_frames(frames, label, loaded.device, passthrough=(EngineError, RunInputError))
    except EngineError as exc:
        raise RunInputError(str(exc)) from None


def _fresh(policy: Policy) -> Policy:
    """A new policy with the same settings (policies may keep per-run state)."""
    return make_policy(policy.name, **policy.config)


def _replay_frames(loaded, columns, run_input, settings, cancel, channels, pacer) -> Iterator[CompareFrame]:
    prompt, trace_ids = prepare(loaded, run_input)
    evicting = [(p, kv) for p, kv in columns if not _is_reference(p, kv)]
    lockstep = LockstepReplay(loaded, [p for p, _ in evicting], prompt, trace_ids, replace(settings, scoring=True),
                              cancel, kv_quants=[kv for _, kv in evicting])
    pairs = {column_label(p.name, kv): (run, f) for (p, kv), run, f in zip(evicting, lockstep.runs, lockstep.fidelity)}
    pairs[REFERENCE_POLICY] = (lockstep.reference, lockstep.reference_fidelity)
    names = [column_label(p.name, kv) for p, kv in columns]
    shown = _Columns(names, [pairs[n][0] for n in names], channels)

    def table() -> list[list[Any]]:
        return [fidelity_row(n, pairs[n][1], None, pairs[n][0].record) for n in names]

    curves = {n: pairs[n][1] for n in names}
    reference = lockstep.reference.record
    yield shown.frame(f"Prefilling {len(prompt.ids)} prompt tokens in {len(evicting) + 1} runs…", table())
    for replayed in lockstep:
        if pacer.due():
            yield shown.frame(f"Replaying in lockstep… {replayed}/{len(trace_ids)} trace tokens", table(),
                              fidelity=curves, reference=reference)
    stopped = reference.summary.get("stopped", "end of trace")
    yield shown.frame(f"Done: {len(trace_ids)} trace tokens through {len(names)} policies (stopped: {stopped}).",
                      table(), done=True, fidelity=curves, reference=reference)


def _generate_frames(loaded, columns, run_input, settings, cancel, channels, measure, pacer) -> Iterator[CompareFrame]:
    prompt, _ = prepare(loaded, run_input)
    names = [column_label(p.name, kv) for p, kv in columns]
    runs = [Run(loaded, policy, prompt, settings, cancel, kv) for policy, kv in columns]
    shown = _Columns(names, runs, channels)
    if REFERENCE_POLICY in names:
        reference, everyone = runs[names.index(REFERENCE_POLICY)], runs
    else:
        interval = columns[0][0].interval
        reference = Run(loaded, make_policy(REFERENCE_POLICY, interval=interval), prompt, settings, cancel)
        everyone = runs + [reference]

    def table(fidelity: dict[str, TokenFidelity] | None = None) -> list[list[Any]]:
        reference_tokens = [t for e in reference.record.events for t in e.token_ids]
        rows = []
        for name, run in zip(names, runs):
            step = divergence_step(reference_tokens, [t for e in run.record.events for t in e.token_ids])
            rows.append(fidelity_row(name, (fidelity or {}).get(name), "never" if step is None else str(step),
                                     run.record))
        return rows

    yield shown.frame(f"Prefilling {len(prompt.ids)} prompt tokens in {len(everyone)} runs…", table())
    streams = [run.generate() for run in everyone]
    active = list(range(len(streams)))
    while active:
        for i in list(active):  # one token from each run in turn: the columns grow together
            if next(streams[i], None) is None:
                active.remove(i)
        if active and pacer.due():
            longest = max(len(r.record.events) for r in everyone)
            yield shown.frame(f"Generating round-robin… {longest} tokens", table())
    full_ids = [t for e in reference.record.events for t in e.token_ids]
    if not measure or cancel.is_set() or not full_ids:
        yield shown.frame("Stopped." if cancel.is_set() else f"Done: {len(full_ids)} tokens.", table(), done=True)
        return
    evicting = [(_fresh(p), kv) for p, kv in columns if not _is_reference(p, kv)]
    lockstep = LockstepReplay(loaded, [p for p, _ in evicting], prompt, full_ids, replace(settings, scoring=False),
                              cancel, kv_quants=[kv for _, kv in evicting])
    fidelity = {column_label(p.name, kv): f for (p, kv), f in zip(evicting, lockstep.fidelity)}
    fidelity[REFERENCE_POLICY] = lockstep.reference_fidelity
    for replayed in lockstep:
        if pacer.due():
            yield shown.frame(f"Measuring fidelity: teacher-forcing the full cache's text… "
                              f"{replayed}/{len(full_ids)}", table(fidelity), fidelity=fidelity,
                              reference=lockstep.reference.record)
    yield shown.frame(f"Done: {len(full_ids)} tokens; NLL / KL / top-1 measured on the full cache's text.",
                      table(fidelity), done=True, fidelity=fidelity, reference=lockstep.reference.record)
