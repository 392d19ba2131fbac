"""``bench load``: concurrent clients against one server: short replays, or a room playing recordings."""

from __future__ import annotations

import argparse

from ...bench.browser import BenchError
from ...bench.load import load, load_table
from ...bench.room_load import MAX_CLIENTS, room_load, room_table
from ...bench.served import served_app, short_replay
from ..common import CliError
from .app_launch import add_served_args, app_args

MIXED_LIVE = 3  # live replays among the playbacks of --mixed


def configure(parser: argparse.ArgumentParser) -> None:
    add_served_args(parser, trace_tokens=256)
    parser.add_argument("--clients", type=int, default=8, help=f"concurrent clients (at most {MAX_CLIENTS})")
    room = parser.add_mutually_exclusive_group()
    room.add_argument(
        "--playback",
        action="store_true",
        help="each client plays a preset's recording (no model): first frame p50/p95/max, own results, server RSS",
    )
    room.add_argument(
        "--mixed",
        action="store_true",
        help=f"--playback plus {MIXED_LIVE} live replays (--live) in the model's line: shown wait against real",
    )
    parser.add_argument("--live", type=int, default=MIXED_LIVE, help="live replays among the clients of --mixed")
    parser.add_argument(
        "--play",
        action="append",
        default=None,
        metavar="PRESET",
        help="the recording the playing clients play (repeat: they take turns; default: --preset's)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="play recordings the server has not decoded yet (default: decoded once first, as picking a preset does)",
    )
    parser.add_argument("--speed", default="4×", help="playback speed, as the Play button's choices (default 4×)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the whole load may take")


def run(args: argparse.Namespace) -> int:
    """K concurrent clients: short replays (own results, queue wait), or a room playing recordings (--playback)."""
    if not 1 <= args.clients <= MAX_CLIENTS:
        raise CliError(f"--clients must be between 1 and {MAX_CLIENTS}, got {args.clients}")
    try:
        replay = short_replay(args.preset, args.trace_tokens, args.interval)
        with served_app(args.url, None, app_args(args)) as served:
            if args.playback or args.mixed:
                live = args.live if args.mixed else 0
                presets = args.play or [args.preset]
                result = room_load(served, args.clients, presets, args.speed, replay, live, args.timeout, args.cold)
                print(room_table(result), end="")
                return 0
            result = load(served, replay, args.clients)
    except BenchError as exc:
        raise CliError(str(exc)) from None
    print(load_table(result), end="")
    return 0
