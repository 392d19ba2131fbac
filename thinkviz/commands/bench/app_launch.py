"""What the benchmarks that drive ``app.py`` share: the arguments that start it with the model the
benchmark was given, and the served-replay options of ``bench soak`` and ``bench load``."""

from __future__ import annotations

import argparse

from ..common import add_model_args


def add_served_args(parser: argparse.ArgumentParser, trace_tokens: int) -> None:
    add_model_args(parser)
    parser.add_argument("--url", default=None, help="drive an app already running there instead of starting app.py")
    parser.add_argument("--preset", default="math_h2o_vs_window", help="the replay preset whose trace is replayed")
    parser.add_argument("--trace-tokens", type=int, default=trace_tokens, help="replay the first N tokens of it")
    parser.add_argument(
        "--interval",
        type=int,
        default=1,
        help="h2o compresses every N tokens (default 1, as the Live tab: one event per token)",
    )


def app_args(args: argparse.Namespace, threads: int | None = None) -> list[str]:
    """``app.py``'s arguments for the model the benchmark was given; with ``threads``, torch on that many."""
    device = ["--device", args.device] if args.device else []
    model = ["--model", args.model, "--quant", args.quant, "--quant-backend", args.quant_backend, *device]
    return model if threads is None else [*model, "--threads", str(threads)]
