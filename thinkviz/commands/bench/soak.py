"""``bench soak``: the server's memory across many successive sessions of short replays."""

from __future__ import annotations

import argparse
import sys

from ...bench.browser import BenchError
from ...bench.served import served_app, short_replay
from ...bench.soak import soak, soak_table
from ..common import CliError
from .app_launch import add_served_args, app_args


def configure(parser: argparse.ArgumentParser) -> None:
    add_served_args(parser, trace_tokens=650)
    parser.add_argument("--sessions", type=int, default=50, help="successive new sessions (after one warm-up)")
    parser.add_argument("--runs", type=int, default=3, help="replays in each session")
    parser.add_argument("--pid", type=int, default=None, help="with --url: the process id of that app (its memory)")
    parser.add_argument(
        "--settle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="wait after each session before reading memory (default: one heartbeat + 2 s: "
        "3 s for the app the benchmark starts, 17 s with --url)",
    )


def run(args: argparse.Namespace) -> int:
    """Server memory across N successive new sessions of M short replays: start, after 5, end, peak, per session."""
    if args.url and args.pid is None:
        raise CliError("bench soak reads the server's memory: with --url give the app's process id (--pid)")
    try:
        replay = short_replay(args.preset, args.trace_tokens, args.interval)
        with served_app(args.url, args.pid, app_args(args)) as served:
            result = soak(
                served,
                replay,
                args.sessions,
                args.runs,
                args.settle,
                progress=lambda message: print(f"[bench soak] {message}", file=sys.stderr),
            )
    except BenchError as exc:
        raise CliError(str(exc)) from None
    print(soak_table(result), end="")
    return 0
