"""Budget × policy × KV-format sweeps: replay traces, measure memory and fidelity, write CSV / JSON / Pareto HTML.

The unit of work is a lockstep :class:`Group`: one trace at one budget in one KV format,
replayed through the full-precision full cache and every chosen policy together
(:class:`~thinkviz.measure.replay.LockstepReplay`), ``interval`` tokens per forward, so every run
of a group sees exactly the same tokens and the reference is computed once per group.  A
quantized format also gets a group of its own with ``full`` in that format (every token
kept, at lower precision: the pure quantization baseline) beside the reference.
:func:`run_group` is the one function that computes a group, whether in this process or on
a worker (:mod:`thinkviz.sweep.runner`); :func:`order_rows` puts the groups' rows in the
sweep's order whatever order they finished in.  A row holds the trace, policy, budget, KV
format, the peak KV bytes measured on the real tensors (codes, scales and residual
included), the compression against the full-precision full cache's peak, fidelity means
(overall and per segment kind) and the replay throughput.  The throughput is a timing, so
it is written apart (``timings.csv``): ``sweep.csv`` / ``sweep.json`` hold only what the
same grid reproduces to the byte.

A policy may be named with its own knobs, ``tam:compaction=match`` (``name:knob=value:…``), so
one sweep compares two settings of one policy; the row's ``policy`` is that text.  For a policy
that fits attention biases a row also holds the mean seconds its fit took per compression
(a timing too).
one sweep compares two settings of one policy; the row's ``policy`` is that text.  A knob may also
be varied (``--vary recent=16,32,64``): every policy that declares it runs once per value (every
combination of several varied knobs), and the row's ``knobs`` says which (``recent=32``).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

from ..core.engine import DecodeSettings
from ..core.kvquant import RESIDUAL, KVQuant
from ..measure.metrics import SEGMENT_KINDS
from ..models.loading import LoadedModel
from ..policies import REFERENCE_POLICY, PolicyConfigError, make_policy, policy_names, policy_params
from ..policies.registry import policy_values
from ..measure.replay import LockstepReplay, Trace, prepare
from ..units import cell
from ..viz.tables import kv_label, mixes_formats, run_label

Progress = Callable[[str, int, int], None]  # (trace name, tokens done, tokens in the trace)

COLUMNS = (
    "trace",
    "policy",
    "budget",
    "kv_quant",
    "knobs",
    "budget_tokens",
    "interval",
    "prompt_tokens",
    "trace_tokens",
    "peak_kv_bytes",
    "full_peak_kv_bytes",
    "kv_fraction",
    "compression",
    "nll",
    "nll_full",
    "nll_delta",
    "ppl",
    "ppl_full",
    "kl",
    "top1",
    "tokens_per_second",
    "fit_seconds",
    *(f"{name}_{kind}" for kind in SEGMENT_KINDS for name in ("nll_delta", "kl", "top1")),
)
TIMING_COLUMNS = ("tokens_per_second", "fit_seconds")  # wall-clock: in timings.csv, not in the result files
RESULT_COLUMNS = tuple(column for column in COLUMNS if column not in TIMING_COLUMNS)


@dataclass(frozen=True)
class Budget:
    """A budget as given: a fraction of the sequence's tokens (``0 < value ≤ 1``) or a token count.

    ``running``: the fraction is of the tokens seen *so far*, at every step (the policies'
    ``budget_mode`` ``fraction``), not of the whole sequence from the start."""

    value: float
    fraction: bool
    running: bool = False

    @property
    def label(self) -> str:
        if self.running:
            return f"{self.value:.0%} of seen"
        return f"{self.value:.0%}" if self.fraction else str(int(self.value))

    def tokens(self, total: int) -> int:
        """Tokens per layer and kv-head for a sequence of ``total`` tokens (prompt + trace); a running
        fraction reaches this at the end."""
        if self.running:
            return max(1, math.ceil(round(self.value * total, 9)))
        return max(1, round(self.value * total)) if self.fraction else int(self.value)

    def policy_values(self, total: int) -> dict[str, Any]:
        """The common knobs that give a policy this budget."""
        if self.running:
            return {"budget_mode": "fraction", "budget_fraction": self.value}
        return {"budget": self.tokens(total)}


def parse_budgets(text: str, running: bool = False) -> list[Budget]:
    """``"0.1,0.25,0.5"`` (fractions) or ``"128,256"`` (tokens), mixed allowed; ValueError otherwise.
    ``running``: fractions of the tokens seen so far (then token counts are refused)."""
    budgets = []
    for item in (part.strip() for part in text.split(",")):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"budget {item!r} is neither a fraction (0.25) nor a token count (256)") from None
        if "." in item or "e" in item.lower():
            if not 0.0 < value <= 1.0:
                raise ValueError(f"a fractional budget must be in (0, 1], got {item}")
            budgets.append(Budget(value, True, running))
        elif running:
            raise ValueError(f"a budget of the tokens seen so far is a fraction (0.25), got {item}")
        elif value >= 1:
            budgets.append(Budget(value, False))
        else:
            raise ValueError(f"a token budget must be a positive integer, got {item}")
    if not budgets:
        raise ValueError("no budgets given")
    return budgets


def split_policy(spec: str) -> tuple[str, dict[str, str]]:
    """``"tam:compaction=match:ridge=0.5"`` → ``("tam", {"compaction": "match", "ridge": "0.5"})``;
    ValueError for a knob the policy does not declare or an item without ``=``."""
    name, *items = [part.strip() for part in spec.split(":")]
    knobs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{spec!r}: a policy's own knob is written knob=value, got {item!r}")
        knobs[key.strip()] = value.strip()
    declared = {p.name for p in policy_params(name)} if name in policy_names() else set()
    stray = sorted(set(knobs) - declared)
    if name in policy_names() and stray:
        raise ValueError(f"{spec!r}: {name} has no parameter {', '.join(stray)}")
    return name, knobs


def parse_policies(text: str, variants: bool = False) -> list[str]:
    """``"h2o,window"`` or ``"all"`` (every registered policy except ``full``, which is the reference).
    ``variants``: an item may carry its own knobs, ``tam:compaction=match`` (:func:`split_policy`)."""
    specs = [spec.strip() for spec in text.split(",") if spec.strip()]
    if specs == ["all"]:
        return [name for name in policy_names() if name != REFERENCE_POLICY]
    known = policy_names()
    names = [split_policy(spec)[0] if variants else spec for spec in specs]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(map(repr, unknown))}; choose from: {', '.join(known)}")
    if not specs:
        raise ValueError("no policies given")
    return [spec for spec, name in dict.fromkeys(zip(specs, names)) if name != REFERENCE_POLICY]


def parse_vary(text: str) -> dict[str, list[str]]:
    """``"recent=16,32,64"`` (several knobs separated by ``;`` or new lines) → ``{"recent": ["16", "32",
    "64"]}``: the knobs to vary and their values, as written (each policy coerces its own); ValueError
    for anything else."""
    vary: dict[str, list[str]] = {}
    for item in (part.strip() for part in text.replace("\n", ";").split(";")):
        if not item:
            continue
        key, sep, values = (piece.strip() for piece in item.partition("="))
        chosen = [value.strip() for value in values.split(",") if value.strip()]
        if not sep or not key or not chosen:
            raise ValueError(f"vary a knob as KNOB=V1,V2,… (e.g. recent=16,32,64), got {item!r}")
        if key in vary:
            raise ValueError(f"the knob {key!r} is varied twice")
        vary[key] = list(dict.fromkeys(chosen))
    return vary


def check_vary(policies: Sequence[str], vary: dict[str, list[str]]) -> None:
    """ValueError unless every varied knob is declared by one of ``policies`` (names or
    ``policy:knob=value`` specs, :func:`split_policy`), no spec also sets a knob it varies, and every
    value is one the declaring policies accept (checked before any model loads)."""
    check_params(policies, vary)
    for spec in policies:
        name, own = split_policy(spec)
        declared = {p.name: p for p in policy_params(name)}
        both = sorted(set(own) & set(vary))
        if both:
            raise ValueError(f"{spec!r} sets {', '.join(both)}, which --vary also varies: give each knob one way")
        for key, values in vary.items():
            for value in values if key in declared else ():
                declared[key].coerce(value)


def vary_grid(name: str, vary: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of the varied knobs policy ``name`` (a name or a ``policy:knob=value`` spec)
    declares (``[{}]``: it declares none, so it runs once)."""
    declared = {p.name for p in policy_params(split_policy(name)[0])}
    mine = {key: values for key, values in vary.items() if key in declared}
    return [dict(zip(mine, combo)) for combo in itertools.product(*mine.values())]


def check_params(policies: Sequence[str], params: dict[str, Any]) -> None:
    """ValueError if a ``--param`` is declared by none of ``policies``."""
    declared = {p.name for spec in policies for p in policy_params(split_policy(spec)[0])}
    stray = sorted(set(params) - declared)
    if stray:
        raise ValueError(f"no selected policy takes parameter {', '.join(stray)}")


@dataclass(frozen=True)
class SweepSettings:
    """What every group of a sweep shares: the policies (in row order), the interval, the policy
    knobs (each given to the policies that declare it), how much of each trace to replay and the
    varied knobs (:func:`parse_vary`: each policy runs once per combination of those it declares)."""

    policies: tuple[str, ...]
    interval: int = 32
    params: dict[str, Any] = field(default_factory=dict)
    max_trace_tokens: int | None = None
    vary: dict[str, list[str]] = field(default_factory=dict)

    def variants(self) -> list[tuple[str, dict[str, str]]]:
        """``(policy spec, varied knobs)`` of every policy run of a budgeted group, in row order."""
        return [(spec, combo) for spec in self.policies for combo in vary_grid(spec, self.vary)]


@dataclass(frozen=True)
class Group:
    """One lockstep group: ``trace`` at ``budget`` in ``kv_quant``, with the full-precision
    full-cache reference and every policy of the sweep; ``budget`` None: ``full`` in
    ``kv_quant`` (a quantized format's baseline) beside the reference, no policy."""

    trace: Trace
    budget: Budget | None
    kv_quant: KVQuant = KVQuant()

    @property
    def name(self) -> str:
        budget = REFERENCE_POLICY if self.budget is None else self.budget.label
        kv = f" {self.kv_quant.label}" if self.kv_quant.spec.quantized else ""
        return f"{self.trace.name} @ {budget}{kv}"


@dataclass(frozen=True)
class GroupResult:
    """A finished group: its rows (the full-precision full cache first, then each policy in the
    settings' order, or ``full`` in the group's format),
    its wall-clock ``seconds`` and the model that computed it (``model``, ``quantization``, ``device``)."""

    name: str
    rows: list[dict[str, Any]]
    seconds: float
    model: dict[str, str]


def plan_groups(
    traces: Sequence[Trace], budgets: Sequence[Budget], kv_quants: Sequence[KVQuant] = (KVQuant(),)
) -> list[Group]:
    """The groups of a sweep, trace-major: per trace ``full`` in each quantized format, then every
    (budget, KV format).  ValueError when two traces share a name (their groups and rows could
    not be told apart)."""
    names = [trace.name for trace in traces]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"two traces are named {', '.join(map(repr, twice))}; give each trace file its own name")
    return [
        group
        for trace in traces
        for group in [
            *(Group(trace, None, kv) for kv in kv_quants if kv.spec.quantized),
            *(Group(trace, budget, kv) for budget in budgets for kv in kv_quants),
        ]
    ]


def run_group(
    loaded: LoadedModel, group: Group, settings: SweepSettings, progress: Progress | None = None
) -> tuple[GroupResult, LockstepReplay]:
    """Replay ``group`` in lockstep with the full-precision full cache: every policy of ``settings``
    (once per combination of the varied knobs it declares) at the group's budget in its KV format,
    or (budget None) ``full`` in its KV format.

    The one function that computes a group: in this process or on a Ray worker (of a local
    runtime or a cluster).  Returns its result and the finished replay (its records carry per-token
    fidelity).  Raises :class:`~thinkviz.measure.replay.TraceError` /
    :class:`~thinkviz.policies.PolicyConfigError` / :class:`~thinkviz.core.engine.EngineError`.
    """
    trace, budget = group.trace, group.budget
    prompt, ids = prepare(loaded, trace, settings.max_trace_tokens)
    total = len(prompt.ids) + len(ids)
    variants = [(REFERENCE_POLICY, {})] if budget is None else settings.variants()
    budget_values = {} if budget is None else budget.policy_values(total)
    built = []
    for spec, combo in variants:
        name, own = split_policy(spec)
        where = ("" if budget is None else f" at budget {budget.label}") + (
            f" with {knob_text(combo)}" if combo else ""
        )
        try:
            if "budget" in combo and budget is not None and budget.running:
                raise PolicyConfigError("the budget is a fraction of the tokens seen: vary it in --budgets, not --vary")
            # the budget given wins over a knob of the same name; a varied knob wins over both
            values = {**policy_values(name, settings.params), **own, **budget_values, **combo}
            built.append(make_policy(name, interval=settings.interval, **values))
        except (PolicyConfigError, ValueError) as exc:
            raise PolicyConfigError(f"{spec}{where} of {trace.name}: {exc}") from None
    replay = LockstepReplay(
        loaded, built, prompt, ids, DecodeSettings(scoring=False), kv_quants=[group.kv_quant] * len(built)
    )
    start = time.perf_counter()
    for done in replay:
        if progress is not None:
            progress(trace.name, done, len(ids))
    seconds = time.perf_counter() - start
    reference = replay.reference.record
    base = {
        "trace": trace.name,
        "interval": settings.interval,
        "prompt_tokens": len(prompt.ids),
        "trace_tokens": len(ids),
        "full_peak_kv_bytes": reference.summary["peak_kv_bytes"],
    }
    rows = [_row(base, REFERENCE_POLICY, "100%", KVQuant(), "", total, reference)]
    for (spec, combo), run in zip(variants, replay.runs):
        if budget is None:
            label, tokens = "100%", total
        elif "budget" in combo:  # a varied budget replaces the one given
            label, tokens = str(run.policy.budget), run.policy.budget
        else:
            label, tokens = budget.label, budget.tokens(total)
        rows.append(_row(base, spec, label, group.kv_quant, knob_text(combo), tokens, run.record))
    model = {
        "model": loaded.name,
        "quantization": loaded.quantization,
        "backend": loaded.backend,
        "device": str(loaded.device),
    }
    return GroupResult(group.name, rows, seconds, model), replay


def order_rows(groups: Sequence[Group], results: dict[str, GroupResult]) -> list[dict[str, Any]]:
    """The finished groups' rows in the sweep's order: per trace the full-precision full cache once
    (from its first finished group), ``full`` in each quantized format, then each policy over the
    budgets and KV formats in ``groups``' order."""
    rows: list[dict[str, Any]] = []
    for trace in dict.fromkeys(group.trace for group in groups):
        done = [(g, results[g.name]) for g in groups if g.trace == trace and g.name in results]
        if done:
            rows.append(done[0][1].rows[0])
            rows += [result.rows[1] for g, result in done if g.budget is None]
            budgeted = [result for g, result in done if g.budget is not None]
            rows += [result.rows[i] for i in range(1, len(budgeted[0].rows) if budgeted else 1) for result in budgeted]
    return rows


@dataclass
class TraceRuns:
    """The finished runs of a trace's groups, aligned with :func:`sweep_trace`'s rows."""

    reference: Any  # the first group's full-cache :class:`~thinkviz.core.engine.Run`
    runs: list[Any]


def sweep_trace(
    loaded: LoadedModel,
    trace: Trace,
    policies: Sequence[str],
    budgets: Sequence[Budget],
    interval: int = 32,
    params: dict[str, Any] | None = None,
    progress: Progress | None = None,
    max_trace_tokens: int | None = None,
    kv_quants: Sequence[KVQuant] = (KVQuant(),),
    vary: dict[str, list[str]] | None = None,
) -> tuple[list[dict[str, Any]], TraceRuns]:
    """Replay ``trace`` (single-turn or a transcript) through every (policy, budget, KV format, varied
    knobs), one lockstep group per budget and format (:func:`plan_groups`), in this process.

    ``params`` holds policy knobs (``recent``, ``n_sink``, ``protect_system`` ...), each given to
    the policies that declare it; ``max_trace_tokens`` replays only the trace's first tokens
    (an affordable subset on a slow machine); ``kv_quants`` are the KV formats (default: full
    precision only); ``vary`` (:func:`parse_vary`) gives each policy one run per combination of
    the varied knobs it declares (a row's ``knobs`` says which, ``recent=32``).  Returns one row
    per run — the full-precision full cache first, then ``full`` in each quantized format, then
    policy × varied knobs × budget × format — and the runs behind them.  Raises
    :class:`~thinkviz.measure.replay.TraceError` / :class:`~thinkviz.policies.PolicyConfigError` /
    :class:`~thinkviz.core.engine.EngineError`.
    """
    settings = SweepSettings(tuple(policies), interval, dict(params or {}), max_trace_tokens, dict(vary or {}))
    groups = plan_groups([trace], budgets, kv_quants)
    results, replays = {}, []
    for group in groups:
        results[group.name], replay = run_group(loaded, group, settings, progress)
        replays.append((group, replay))
    runs = [replay.runs[0] for group, replay in replays if group.budget is None]
    budgeted = [replay for group, replay in replays if group.budget is not None]
    runs += [replay.runs[i] for i in range(len(budgeted[0].runs) if budgeted else 0) for replay in budgeted]
    return order_rows(groups, results), TraceRuns(replays[0][1].reference, runs)


def knob_text(knobs: dict[str, Any]) -> str:
    """``recent=32, n_sink=4``: the knobs a run varied, as a row and a label show them."""
    return ", ".join(f"{key}={value}" for key, value in knobs.items())


def parse_kv_quants(text: str, residual: int = RESIDUAL) -> list[KVQuant]:
    """``"none,q8_0,q4_0"`` → formats (duplicates dropped); :class:`~thinkviz.core.kvquant.KVQuantError` otherwise."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError("no KV formats given")
    return list(dict.fromkeys(KVQuant.parse(name, residual) for name in names))


def _row(
    base: dict[str, Any], policy: str, budget: str, kv: KVQuant, knobs: str, budget_tokens: int, record
) -> dict[str, Any]:
    summary = record.summary
    fidelity = summary["fidelity"]
    peak = summary["peak_kv_bytes"]
    row = {
        **base,
        "policy": policy,
        "budget": budget,
        "kv_quant": kv.label,
        "knobs": knobs,
        "budget_tokens": budget_tokens,
        "peak_kv_bytes": peak,
        "kv_fraction": peak / base["full_peak_kv_bytes"],
        "compression": base["full_peak_kv_bytes"] / peak,
        "tokens_per_second": summary["tokens_per_second"],
        "fit_seconds": _fit_seconds(record),
    }
    row.update({key: fidelity["all"][key] for key in ("nll", "nll_full", "nll_delta", "ppl", "ppl_full", "kl", "top1")})
    for kind in SEGMENT_KINDS:
        for name in ("nll_delta", "kl", "top1"):
            row[f"{name}_{kind}"] = fidelity[kind][name]
    return {column: row[column] for column in COLUMNS}


def _fit_seconds(record) -> float | None:
    """Mean seconds per compression an attention-matching fit took (``None`` for other policies)."""
    fits = [e.info["fit_seconds"] for e in record.events if "fit_seconds" in e.info]
    return sum(fits) / len(fits) if fits else None


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows' headline numbers as a Markdown table (one line per row; a KV column when formats differ)."""
    kv = mixes_formats(rows)
    lines = [
        "| trace | policy | budget | "
        + ("KV | " if kv else "")
        + "budget tokens | peak KV (of full) | ΔNLL | KL | top-1 | KL think | KL answer | KL code | tok/s | fit s |",
        "|---|---|---:|" + ("---|" if kv else "") + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['trace']} | {run_label(row)} | {row['budget']} | "
            + (f"{kv_label(row)} | " if kv else "")
            + f"{row['budget_tokens']} "
            f"| {cell(row['kv_fraction'], '.1%')} | {cell(row['nll_delta'], '.4f')} | {cell(row['kl'], '.4f')} "
            f"| {cell(row['top1'], '.1%')} | {cell(row['kl_think'], '.4f')} | {cell(row['kl_answer'], '.4f')} "
            f"| {cell(row['kl_code'], '.4f')} | {cell(row['tokens_per_second'], '.1f')} "
            f"| {cell(row['fit_seconds'], '.3f')} |"
        )
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it: a reader (or a crash) sees
    the old file or the new one, never half of one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8", newline="")
    os.replace(temporary, path)


def _csv_text(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows({k: ("" if _finite(v) is None else v) for k, v in row.items()} for row in rows)
    return buffer.getvalue()


def write_rows(rows: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any]) -> dict[str, Path]:
    """Write ``sweep.csv``, ``sweep.json`` (``{"meta", "rows"}``), ``sweep.md``, ``pareto.html`` and
    ``timings.csv`` into ``out_dir``.

    ``sweep.csv`` / ``sweep.json`` hold :data:`RESULT_COLUMNS` (the same bytes for the same grid,
    however it was computed); the measured throughput goes to ``timings.csv`` (keyed by trace,
    policy, budget and KV format) and to the table in ``sweep.md``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out_dir / "sweep.csv",
        "json": out_dir / "sweep.json",
        "md": out_dir / "sweep.md",
        "html": out_dir / "pareto.html",
        "timings": out_dir / "timings.csv",
    }
    write_atomic(paths["csv"], _csv_text(rows, RESULT_COLUMNS))
    clean = [{k: _finite(row[k]) for k in RESULT_COLUMNS} for row in rows]
    write_atomic(paths["json"], json.dumps({"meta": meta, "rows": clean}, indent=1))
    write_atomic(paths["timings"], _csv_text(rows, ("trace", "policy", "budget", "kv_quant", *TIMING_COLUMNS)))
    write_atomic(paths["md"], markdown_table(rows))
    from ..viz.pareto import pareto_figure  # plotly, here only: the CLI must import without it (bench gpu)

    pareto_figure(rows).write_html(paths["html"], include_plotlyjs=True)
    return paths
