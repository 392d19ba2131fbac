"""``bench summary``: several sweeps in one table (a row per policy and budget, a column per trace)
and one Pareto figure."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...bench.summary import SummaryError, load_sweep_rows, select_runs, summary_table
from ..common import CliError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sweeps", nargs="+", metavar="SWEEP", help="a sweep.json, or a folder written by bench sweep --out"
    )
    parser.add_argument("--metric", default="nll_delta", help="nll_delta (default), kl or top1")
    parser.add_argument(
        "--policies", default=None, help="comma-separated runs to keep, as the table names them (default: every run)"
    )
    parser.add_argument(
        "--out", default=None, help="also write summary.md and one Pareto figure with a panel per trace here"
    )


def run(args: argparse.Namespace) -> int:
    """Line up several sweeps: one row per (policy, budget), one column per trace."""
    try:
        rows = load_sweep_rows(args.sweeps)
        if args.policies is not None:
            rows = select_runs(rows, [name.strip() for name in args.policies.split(",") if name.strip()])
        table = summary_table(rows, args.metric)
    except SummaryError as exc:
        raise CliError(str(exc)) from None
    print(table, end="")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.md").write_text(table, encoding="utf-8")
        from ...viz.pareto import pareto_figure  # plotly, here only: the CLI must import without it (bench gpu)

        pareto_figure(rows, args.metric).write_html(out / "pareto.html", include_plotlyjs=True)
        print(f"written: {out / 'summary.md'}, {out / 'pareto.html'}")
    return 0
