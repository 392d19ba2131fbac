"""Budget × policy × KV-format sweeps: replay traces, measure memory and fidelity, write CSV / JSON / Pareto HTML.

For each trace every (policy, budget, KV format) is replayed in lockstep with one full-cache,
full-precision run (:class:`~thinkviz.replay.LockstepReplay`), ``interval`` tokens per
forward, so the reference is computed once per trace and every run sees exactly the same
tokens.  Each quantized format also gets a ``full`` run in that format (every token kept, at
lower precision: the pure quantization baseline).  A row holds the trace, policy, budget, KV
format, the peak KV bytes measured on the real tensors (codes, scales and residual included),
the compression against the full-precision full cache's peak, fidelity means (overall and
per segment kind), the replay throughput and, for a policy that fits attention biases, the
mean seconds its fit took per compression.

A policy may be named with its own knobs, ``tam:compaction=match`` (``name:knob=value:…``), so
one sweep compares two settings of one policy; the row's ``policy`` is that text.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .engine import DecodeSettings
from .kvquant import KVQuant
from .metrics import SEGMENT_KINDS
from .model import LoadedModel
from .policies import REFERENCE_POLICY, PolicyConfigError, make_policy, policy_names, policy_params
from .replay import LockstepReplay, Trace, prepare
from .viz.tables import cell, kv_label, mixes_formats

Progress = Callable[[str, int, int], None]  # (trace name, tokens done, tokens in the trace)

COLUMNS = (
    "trace", "policy", "budget", "kv_quant", "budget_tokens", "interval", "prompt_tokens", "trace_tokens",
    "peak_kv_bytes", "full_peak_kv_bytes", "kv_fraction", "compression",
    "nll", "nll_full", "nll_delta", "ppl", "ppl_full", "kl", "top1", "tokens_per_second", "fit_seconds",
    *(f"{name}_{kind}" for kind in SEGMENT_KINDS for name in ("nll_delta", "kl", "top1")),
)


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


def policy_values(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``params`` that policy ``name`` declares (others ignore a knob they lack)."""
    declared = {p.name for p in policy_params(name)}
    return {key: value for key, value in params.items() if key in declared}


def check_params(policies: Sequence[str], params: dict[str, Any]) -> None:
    """ValueError if a ``--param`` is declared by none of ``policies``."""
    declared = {p.name for spec in policies for p in policy_params(split_policy(spec)[0])}
    stray = sorted(set(params) - declared)
    if stray:
        raise ValueError(f"no selected policy takes parameter {', '.join(stray)}")


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
) -> tuple[list[dict[str, Any]], LockstepReplay]:
    """Replay ``trace`` (single-turn or a transcript) through every (policy, budget, KV format) in
    lockstep with the full cache.

    ``params`` holds policy knobs (``recent``, ``n_sink``, ``protect_system`` ...), each given to
    the policies that declare it; ``max_trace_tokens`` replays only the trace's first tokens
    (an affordable subset on a slow machine); ``kv_quants`` are the KV formats (default: full
    precision only).  Returns one row per run — the full-precision full cache first, then
    ``full`` in each quantized format, then policy × budget × format — and the finished replay
    (its records carry per-token fidelity).  Raises :class:`~thinkviz.replay.TraceError` /
    :class:`~thinkviz.policies.PolicyConfigError` / :class:`~thinkviz.engine.EngineError`.
    """
    params = dict(params or {})
    prompt, ids = prepare(loaded, trace, max_trace_tokens)
    total = len(prompt.ids) + len(ids)
    grid = [(REFERENCE_POLICY, None, kv) for kv in kv_quants if kv.spec.quantized]
    grid += [(spec, budget, kv) for spec in policies for budget in budgets for kv in kv_quants]
    built = []
    for spec, budget, _ in grid:
        name, own = split_policy(spec)
        try:  # the budget given wins over a knob of the same name
            values = {**policy_values(name, params), **own, **({} if budget is None else budget.policy_values(total))}
            built.append(make_policy(name, interval=interval, **values))
        except PolicyConfigError as exc:
            where = "" if budget is None else f" at budget {budget.label}"
            raise PolicyConfigError(f"{spec}{where} of {trace.name}: {exc}") from None
    replay = LockstepReplay(loaded, built, prompt, ids, DecodeSettings(scoring=False),
                            kv_quants=[kv for _, _, kv in grid])
    for done in replay:
        if progress is not None:
            progress(trace.name, done, len(ids))
    reference = replay.reference.record
    full_peak = reference.summary["peak_kv_bytes"]
    base = {"trace": trace.name, "interval": interval, "prompt_tokens": len(prompt.ids), "trace_tokens": len(ids),
            "full_peak_kv_bytes": full_peak}
    rows = [_row(base, REFERENCE_POLICY, "100%", KVQuant(), total, reference)]
    for (name, budget, kv), run in zip(grid, replay.runs):
        label, tokens = ("100%", total) if budget is None else (budget.label, budget.tokens(total))
        rows.append(_row(base, name, label, kv, tokens, run.record))
    return rows, replay


def parse_kv_quants(text: str, residual: int = 32) -> list[KVQuant]:
    """``"none,q8_0,q4_0"`` → formats (duplicates dropped); :class:`~thinkviz.kvquant.KVQuantError` otherwise."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError("no KV formats given")
    return list(dict.fromkeys(KVQuant.parse(name, residual) for name in names))


def _row(base: dict[str, Any], policy: str, budget: str, kv: KVQuant, budget_tokens: int, record) -> dict[str, Any]:
    summary = record.summary
    fidelity = summary["fidelity"]
    peak = summary["peak_kv_bytes"]
    row = {**base, "policy": policy, "budget": budget, "kv_quant": kv.label, "budget_tokens": budget_tokens,
           "peak_kv_bytes": peak,
           "kv_fraction": peak / base["full_peak_kv_bytes"], "compression": base["full_peak_kv_bytes"] / peak,
           "tokens_per_second": summary["tokens_per_second"], "fit_seconds": _fit_seconds(record)}
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
        "| trace | policy | budget | " + ("KV | " if kv else "")
        + "budget tokens | peak KV (of full) | ΔNLL | KL | top-1 | KL think | KL answer | KL code | tok/s | fit s |",
        "|---|---|---:|" + ("---|" if kv else "") + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['trace']} | {row['policy']} | {row['budget']} | "
            + (f"{kv_label(row)} | " if kv else "") + f"{row['budget_tokens']} "
            f"| {cell(row['kv_fraction'], '.1%')} | {cell(row['nll_delta'], '.4f')} | {cell(row['kl'], '.4f')} "
            f"| {cell(row['top1'], '.1%')} | {cell(row['kl_think'], '.4f')} | {cell(row['kl_answer'], '.4f')} "
            f"| {cell(row['kl_code'], '.4f')} | {cell(row['tokens_per_second'], '.1f')} "
            f"| {cell(row['fit_seconds'], '.3f')} |"
        )
    return "\n".join(lines) + "\n"


def write_rows(rows: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any]) -> dict[str, Path]:
    """Write ``sweep.csv``, ``sweep.json`` (``{"meta", "rows"}``), ``sweep.md`` and ``pareto.html`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / "sweep.csv", "json": out_dir / "sweep.json", "md": out_dir / "sweep.md",
             "html": out_dir / "pareto.html"}
    with open(paths["csv"], "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: ("" if _finite(v) is None else v) for k, v in row.items()} for row in rows)
    clean = [{k: _finite(v) for k, v in row.items()} for row in rows]
    paths["json"].write_text(json.dumps({"meta": meta, "rows": clean}, indent=1), encoding="utf-8")
    paths["md"].write_text(markdown_table(rows), encoding="utf-8")
    from .viz.pareto import pareto_figure  # plotly, here only: the CLI must import without it (bench gpu)

    pareto_figure(rows).write_html(paths["html"], include_plotlyjs=True)
    return paths
