"""Command line: ``python -m thinkviz generate|bench|inspect|lesson|models|policies|presets|train-predictor …``
(or ``thinkviz …``).

Every user error ends with one line ``thinkviz: error: <reason>`` on stderr and exit code 2;
a run that fails mid-way (the model or a policy raised, device out of memory) with one line
and exit code 1.  The subcommands live in :mod:`thinkviz.commands`, one module each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from collections.abc import Sequence

from .commands.common import COMMANDS, CliError
from .commands import bench, generate, inspect, lesson, models, policies, presets, train_predictor  # noqa: F401  (each registers itself)
from .core.faults import RunFault


def build_parser() -> argparse.ArgumentParser:
    prog = "thinkviz" if Path(sys.argv[0]).name == "thinkviz" else "python -m thinkviz"  # the console script
    parser = argparse.ArgumentParser(prog=prog, description="ThinkViz: KV-cache eviction, measured.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (configure, run) in COMMANDS.items():
        child = sub.add_parser(name, help=(run.__doc__ or "").strip().splitlines()[0])
        configure(child)
        child.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return args.run(args)
    except CliError as exc:
        print(f"thinkviz: error: {exc}", file=sys.stderr)
        return 2
    except RunFault as exc:  # the model or a policy failed mid-run: its message is one line
        print(f"thinkviz: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("thinkviz: interrupted", file=sys.stderr)
        return 130
