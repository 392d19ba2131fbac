"""``bench scale``: the same sweep grid in this process and on local Ray workers; the speed-up and
whether both wrote the same files."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from ...sweep.grid import write_rows
from ..common import CliError, load_from_args
from .sweep_grid import add_grid_args, plan_grid, run_grid, sweep_meta


def configure(parser: argparse.ArgumentParser) -> None:
    add_grid_args(parser)
    parser.add_argument("--workers", type=int, default=2, metavar="N", help="local Ray workers (default 2)")


def run(args: argparse.Namespace) -> int:
    """The same sweep grid in this process, then on N local Ray workers: wall-clock speed-up, per-group times."""
    grid = plan_grid(args)
    started = time.perf_counter()
    loaded = load_from_args(args)
    load_seconds = time.perf_counter() - started
    runs = {}
    for label, workers in (("in-process", None), (f"{args.workers} Ray workers", args.workers)):
        outcome, start_seconds, seconds = run_grid(grid, lambda: loaded, workers, None)
        if outcome.failures:
            raise CliError(f"{len(outcome.failures)} groups failed in the {label} run; see above")
        runs[label] = (outcome, start_seconds + (load_seconds if workers is None else 0.0), seconds)
    (local, local_start, local_seconds), (ray_run, ray_start, ray_seconds) = runs.values()
    with tempfile.TemporaryDirectory(prefix="thinkviz-scale-") as tmp:
        files = [
            write_rows(outcome.rows(grid.groups), Path(tmp) / str(i), sweep_meta(args, grid, outcome))
            for i, (outcome, _, _) in enumerate(runs.values())
        ]
        first, second = files
        same = all(first[key].read_bytes() == second[key].read_bytes() for key in ("csv", "json"))
    groups = len(grid.groups)
    alone = sum(group.budget is None for group in grid.groups)
    print(
        f"grid: {groups} groups ({len(grid.settings.variants())} policy runs + the full cache each; {alone} of them "
        f"the full cache in a quantized format alone); model {grid.spec.name}; this process runs "
        f"{torch.get_num_threads()} threads, each worker 1"
    )
    print("| run | start s | groups s | total s | wall s per group | groups per hour |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, (_, start_seconds, seconds) in runs.items():
        print(
            f"| {label} | {start_seconds:.1f} | {seconds:.1f} | {start_seconds + seconds:.1f} | "
            f"{seconds / groups:.2f} | {3600 * groups / seconds:.0f} |"
        )
    print(
        f"speed-up over the groups ({args.workers} workers ÷ in-process): {local_seconds / ray_seconds:.2f}  "
        "(target >= 1.6)"
    )
    print(f"speed-up including start-up: {(local_start + local_seconds) / (ray_start + ray_seconds):.2f}")
    print(f"sweep.csv and sweep.json identical: {'yes' if same else 'NO'}")
    print("| group | replay s in-process | replay s on a worker |")
    print("|---|---:|---:|")
    for group in grid.groups:
        print(f"| {group.name} | {local.results[group.name].seconds:.2f} | {ray_run.results[group.name].seconds:.2f} |")
    return 0 if same else 1
