"""``bench sweep``: replay traces through policies × budgets and write the table, the files and a
memory-vs-fidelity Pareto plot; ``--resume`` continues one, ``--workers`` runs it on Ray."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ...sweep.grid import markdown_table, write_rows
from ...sweep.store import GroupStore
from ..common import CliError, load_from_args
from .sweep_grid import add_grid_args, plan_grid, run_grid, sweep_meta


def configure(parser: argparse.ArgumentParser) -> None:
    add_grid_args(parser)
    parser.add_argument(
        "--out",
        default=None,
        help="folder for sweep.csv, sweep.json, pareto.html, timings.csv and groups/ (default sweep-out)",
    )
    parser.add_argument(
        "--resume",
        default=None,
        metavar="OUT",
        help="continue the sweep in OUT: groups already in OUT/groups/ are kept, damaged ones and the rest computed",
    )
    parser.add_argument("--save-runs", action="store_true", help="also save every run's recording into OUT/runs/")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="run the groups on a local Ray runtime of N workers, one model each "
        "(with --ray-address: N workers on that cluster; needs 'pip install ray')",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="run the groups on the Ray cluster at ADDR (e.g. 10.0.0.5:6379)",
    )


def run(args: argparse.Namespace) -> int:
    """Replay traces through policies × budgets; write CSV, JSON and a memory-vs-fidelity Pareto plot."""
    if args.resume is not None and args.out is not None and Path(args.out) != Path(args.resume):
        raise CliError(f"--resume {args.resume} continues the sweep in that folder; leave out --out {args.out}")
    grid = plan_grid(args)
    out = Path(args.resume or args.out or "sweep-out")
    store = GroupStore(out, grid.settings, dataclasses.asdict(grid.spec))
    outcome, start_seconds, seconds = run_grid(
        grid,
        lambda: load_from_args(args),
        args.workers,
        args.ray_address,
        store,
        args.resume is not None,
        out / "runs" if args.save_runs else None,
    )
    rows = outcome.rows(grid.groups)
    if not rows:
        return 1
    paths = write_rows(rows, out, sweep_meta(args, grid, outcome))
    print(markdown_table(rows), end="")
    computed = len(outcome.results) - outcome.reused
    print(
        f"groups: {len(outcome.results)} of {len(grid.groups)} finished ({outcome.reused} reused from "
        f"{out / 'groups'}, {computed} computed in {start_seconds + seconds:.1f} s), {len(outcome.failures)} failed"
    )
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return 1 if outcome.failures else 0
