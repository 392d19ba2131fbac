"""``bench batch``: Compare's columns and a sweep group batched into one forward pass, against one pass each."""

from __future__ import annotations

import argparse
import sys

from ...bench.batch import COLUMNS, SWEEP_POLICIES, measure_batch, report
from ...measure.replay import TraceError, load_trace, prepare
from ...policies import PolicyConfigError, make_policy
from ...sweep.grid import parse_policies
from ..common import CliError, add_model_args, load_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument(
        "--trace", default="math_h2o_vs_window", metavar="PRESET_OR_FILE", help="the trace the replays teacher-force"
    )
    parser.add_argument("--trace-tokens", type=int, default=1024, help="replay the trace's first N tokens")
    parser.add_argument("--new-tokens", type=int, default=256, help="tokens each Compare column generates")
    parser.add_argument("--columns", default=",".join(COLUMNS), help="Compare's columns (comma-separated policies)")
    parser.add_argument(
        "--sweep-policies", default=",".join(SWEEP_POLICIES), help="the sweep group's policies (besides the full cache)"
    )
    parser.add_argument("--budget", type=int, default=256, help="tokens kept per layer and kv-head")
    parser.add_argument("--interval", type=int, default=32, help="replay chunk = compression interval")
    parser.add_argument("--repeats", type=int, default=1)


def _policies(text: str, flag: str) -> list[str]:
    """The policies named in ``text`` (the full cache kept, as a Compare column may be it)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    try:
        parse_policies(",".join(names) or ",")
    except ValueError as exc:
        raise CliError(f"{flag}: {exc}") from None
    return names


def run(args: argparse.Namespace) -> int:
    """Compare (generate, replay) and a sweep group batched ÷ one column or replay alone; one pass per run beside."""
    columns = _policies(args.columns, "--columns")
    sweep = _policies(args.sweep_policies, "--sweep-policies")
    if min(args.trace_tokens, args.new_tokens, args.budget, args.interval, args.repeats) < 1:
        raise CliError("--trace-tokens, --new-tokens, --budget, --interval and --repeats must be at least 1")
    try:
        for name in {*columns, *sweep}:
            make_policy(name, budget=args.budget, interval=args.interval)
        trace = load_trace(args.trace)
    except (TraceError, PolicyConfigError) as exc:
        raise CliError(str(exc)) from None
    loaded = load_from_args(args)
    try:
        prompt, ids = prepare(loaded, trace, args.trace_tokens)
    except TraceError as exc:
        raise CliError(str(exc)) from None
    print(
        f"model: {loaded.name} ({loaded.quantization}, {loaded.device}); trace {trace.name}: "
        f"{len(prompt.ids)} prompt + {len(ids)} trace tokens; {args.new_tokens} generated; "
        f"budget {args.budget}, interval {args.interval}, best of {args.repeats}"
    )
    result = measure_batch(
        loaded,
        prompt,
        ids,
        columns,
        sweep,
        args.new_tokens,
        args.budget,
        args.interval,
        args.repeats,
        progress=lambda line: print(f"[    ] {line}", file=sys.stderr, flush=True),
    )
    for line in report(result, len(columns), len(sweep)):
        print(line)
    return 0
