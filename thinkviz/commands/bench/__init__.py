"""``python -m thinkviz bench KIND``: benchmarks that print ratios measured in one run.

One module per kind, each with ``configure(parser)`` (its options) and ``run(args) -> int`` (whose
docstring's first line is its help); :data:`KINDS` lists them in the order ``--help`` shows.
:mod:`.sweep_grid` is the grid ``sweep`` and ``scale`` share, :mod:`.app_launch` the ``app.py``
arguments of the kinds that start the app.  The measuring itself lives in :mod:`thinkviz.bench`.
"""

from __future__ import annotations

import argparse
from types import ModuleType

from ..common import command
from . import (
    batch,
    browser,
    gpu,
    load,
    overhead,
    profile,
    quant_kernels,
    quant_speed,
    replay_cost,
    scale,
    soak,
    summary,
    sweep,
)

KINDS: dict[str, ModuleType] = {
    "overhead": overhead,
    "profile": profile,
    "quant-speed": quant_speed,
    "quant-kernels": quant_kernels,
    "sweep": sweep,
    "scale": scale,
    "summary": summary,
    "replay-cost": replay_cost,
    "browser": browser,
    "gpu": gpu,
    "soak": soak,
    "load": load,
    "batch": batch,
}


def configure(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="kind", required=True)
    for name, module in KINDS.items():
        child = kinds.add_parser(name, help=(module.run.__doc__ or "").strip().splitlines()[0])
        module.configure(child)
        child.set_defaults(run=module.run)


@command("bench", configure)
def bench(args: argparse.Namespace) -> int:
    """Run a benchmark (overhead, sweep, replay-cost, …); each prints a measured ratio."""
    return args.run(args)
