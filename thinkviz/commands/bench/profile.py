"""``bench profile``: one engine decode step, part by part (model, hooks, policy, cache, Python)."""

from __future__ import annotations

import argparse

from ...bench.profile import profile_decode
from ...policies import PolicyConfigError, make_policy
from ..common import CliError, add_model_args, load_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument("--policy", default="h2o", help="the policy of the profiled run")
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--interval", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64, help="decode steps profiled (after the first)")
    parser.add_argument("--ops", type=int, default=12, help="how many aten operators to list")
    parser.add_argument(
        "--no-scoring",
        action="store_true",
        help="do not compute the per-token scores the views show (what a sweep does)",
    )


def run(args: argparse.Namespace) -> int:
    """Where one engine decode step's time goes: model parts, hooks, policy, cache, Python."""
    if args.new_tokens < 1 or args.ops < 0 or args.interval < 1:
        raise CliError("--new-tokens and --interval must be at least 1 and --ops at least 0")
    try:
        make_policy(args.policy, budget=args.budget, interval=args.interval)
    except PolicyConfigError as exc:
        raise CliError(str(exc)) from None
    loaded = load_from_args(args)
    result = profile_decode(
        loaded, args.policy, args.budget, args.interval, args.new_tokens, args.ops, scoring=not args.no_scoring
    )
    print(
        f"model: {loaded.name} ({loaded.quantization}, {loaded.backend}, {loaded.device}); {args.policy}, "
        f"budget {args.budget}, interval {args.interval}, scoring {'off' if args.no_scoring else 'on'}, "
        f"{result.attention} attention; {result.steps} decode steps"
    )
    print(
        f"step time: {1e3 * result.plain_step_seconds:.2f} ms plain, "
        f"{1e3 * result.step_seconds:.2f} ms timed part by part"
    )
    print("| part of a decode step | ms / step | share | calls / step |")
    print("|---|---:|---:|---:|")
    for name, seconds, calls in result.parts:
        print(
            f"| {name} | {1e3 * seconds:.2f} | {100 * seconds / result.step_seconds:.1f} % | "
            f"{f'{calls:.3g}' if calls else '–'} |"
        )
    if result.operators:
        print("\n| aten operator (torch.profiler, self CPU) | ms / step | calls / step |")
        print("|---|---:|---:|")
        for name, seconds, calls in result.operators:
            print(f"| {name} | {1e3 * seconds:.2f} | {calls:.3g} |")
    return 0
