"""One table across sweeps: a row per (policy, budget, KV format), a column per trace.

``bench sweep`` writes one ``sweep.json`` per run (see :mod:`thinkviz.sweep.grid`).  When
several traces were swept separately, :func:`summary_table` lines their rows up so that a
policy can be read across traces at a glance: the chosen metric per trace, its mean over
the traces, and the largest peak KV fraction the policy reached at that budget.  Sweeps
written before KV formats existed have no ``kv_quant`` column: their rows are full precision,
and the table shows a KV column only when some row is quantized.

In every (trace, budget) column the best value of each KV format is bold, among the rows that held the
budget — those whose peak KV is within half a percentage point of the smallest peak at
that budget — so a policy that kept more memory than asked (think_drop keeps code and
unfinished blocks) cannot win by ignoring its budget.  Pure: rows in, Markdown out.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Sequence

from ..measure.metrics import METRICS
from ..policies import REFERENCE_POLICY
from ..units import cell
from ..viz.tables import kv_label, mixes_formats, run_label

REQUIRED = ("trace", "policy", "budget", "kv_fraction", *METRICS)
BUDGET_SLACK = 0.005  # peak KV (fraction of full) within which a row counts as holding its budget


class SummaryError(ValueError):
    """A sweep result cannot be summarised; the message names the file and the problem."""


def load_sweep_rows(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The rows of every ``sweep.json`` given (a file, or a ``bench sweep --out`` folder), in order.

    Sweeps of one trace with other policies combine: each has the trace's full-cache reference
    row, which is kept once when they measured the same number of tokens.  Raises
    :class:`SummaryError` for a missing, unreadable or malformed file, for a (trace, policy,
    budget, KV format) that two files both contain and for two references of one trace over
    different lengths.
    """
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[str, ...], tuple[Path, dict[str, Any]]] = {}
    for given in paths:
        path = Path(given)
        path = path / "sweep.json" if path.is_dir() else path
        for row in _read_rows(path):
            key = (row["trace"], run_label(row), row["budget"], kv_label(row))
            if key in seen:
                other, first = seen[key]
                if row["policy"] != REFERENCE_POLICY or row.get("trace_tokens") != first.get("trace_tokens"):
                    shown = key if key[3] != "none" else key[:3]
                    raise SummaryError(f"{path}: {' / '.join(shown)} is also in {other}")
                continue
            seen[key] = path, row
            rows.append(row)
    if not rows:
        raise SummaryError("no sweep results given")
    return rows


def _read_rows(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SummaryError(f"{path} does not exist (give a sweep.json or a bench sweep --out folder)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SummaryError(f"{path} is not a sweep result: {exc}") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise SummaryError(f"{path} is not a sweep result: no 'rows' list")
    for number, row in enumerate(rows, 1):
        missing = [key for key in REQUIRED if not isinstance(row, dict) or key not in row]
        if missing:
            raise SummaryError(f"{path}: row {number} lacks {', '.join(missing)}")
    return rows


def select_runs(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of the runs ``names`` (as the table names them: ``h2o``, ``tam:compaction=match``,
    ``h2o · recent=32``), in their stored order; :class:`SummaryError` for a name no row has."""
    present = {run_label(row) for row in rows}
    unknown = [name for name in names if name not in present]
    if unknown:
        raise SummaryError(
            f"no rows of {', '.join(map(repr, unknown))} in the sweeps given (they have: {', '.join(sorted(present))})"
        )
    wanted = set(names)
    return [row for row in rows if run_label(row) in wanted]


def summary_table(rows: Sequence[dict[str, Any]], metric: str = "nll_delta") -> str:
    """Markdown: ``| policy | budget | [KV |] <one column per trace> | mean | peak KV (of full, worst) |``.

    Rows keep the order in which (policy, budget, KV format) first appear; traces keep theirs.
    A missing (trace, policy, budget, format) shows "–" and is left out of the mean.
    """
    if metric not in METRICS:
        raise SummaryError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    higher_is_better = METRICS[metric][1]
    traces = list(dict.fromkeys(row["trace"] for row in rows))
    keys = list(dict.fromkeys((run_label(row), row["budget"], kv_label(row)) for row in rows))
    cell = {(row["trace"], run_label(row), row["budget"], kv_label(row)): row for row in rows}
    best = _best_per_column(rows, metric, higher_is_better)
    kv = mixes_formats(rows)

    lines = [
        "| policy | budget | " + ("KV | " if kv else "") + " | ".join(traces) + " | mean | peak KV (of full, worst) |",
        "|---|---:|" + ("---|" if kv else "") + "---:|" * len(traces) + "---:|---:|",
    ]
    for policy, budget, fmt in keys:
        found = [cell.get((trace, policy, budget, fmt)) for trace in traces]
        values = [_number(row[metric]) if row else math.nan for row in found]
        cells = [
            _format(value, metric, bold=row is not None and id(row) in best.get((trace, budget, fmt), ()))
            for trace, row, value in zip(traces, found, values)
        ]
        present = [value for value in values if not math.isnan(value)]
        mean = sum(present) / len(present) if present else math.nan
        peak = max((_number(row["kv_fraction"]) for row in found if row), default=math.nan)
        lines.append(
            f"| {policy} | {budget} | "
            + (f"{fmt} | " if kv else "")
            + " | ".join(cells)
            + f" | {_format(mean, metric)} | {_format(peak, 'top1')} |"
        )
    return "\n".join(lines) + "\n"


def _best_per_column(rows: Sequence[dict[str, Any]], metric: str, higher_is_better: bool) -> dict[tuple, set[int]]:
    """``(trace, budget, KV format) -> {id(row)}`` of the best rows (ties included) among those
    that held the budget.

    The full cache is never a contender: it has no budget to hold.
    """
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row["policy"] != REFERENCE_POLICY and not math.isnan(_number(row[metric])):
            groups.setdefault((row["trace"], row["budget"], kv_label(row)), []).append(row)
    sign = -1.0 if higher_is_better else 1.0
    best = {}
    for key, group in groups.items():
        floor = min(_number(row["kv_fraction"]) for row in group)
        held = [row for row in group if _number(row["kv_fraction"]) <= floor + BUDGET_SLACK]
        top = min(sign * _number(row[metric]) for row in held)
        best[key] = {id(row) for row in held if sign * _number(row[metric]) == top}
    return best


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def _format(value: float, metric: str, bold: bool = False) -> str:
    text = cell(value, ".1%" if metric == "top1" else ".3f")
    return f"**{text}**" if bold and text != "–" else text
