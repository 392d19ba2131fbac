"""``bench load``: concurrent clients, one short replay each, against one server."""

from __future__ import annotations

import argparse

from ...bench.browser import BenchError
from ...bench.load import load, load_table
from ...bench.served import served_app, short_replay
from ..common import CliError
from .app_launch import add_served_args, app_args


def configure(parser: argparse.ArgumentParser) -> None:
    add_served_args(parser, trace_tokens=256)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients, one replay each")


def run(args: argparse.Namespace) -> int:
    """K concurrent clients, one short replay each: all finish with their own result; queue wait and total time."""
    try:
        replay = short_replay(args.preset, args.trace_tokens, args.interval)
        with served_app(args.url, None, app_args(args)) as served:
            result = load(served, replay, args.clients)
    except BenchError as exc:
        raise CliError(str(exc)) from None
    print(load_table(result), end="")
    return 0
