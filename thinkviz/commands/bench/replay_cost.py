"""``bench replay-cost``: a policy's chunked replay of a trace against one plain full-cache pass."""

from __future__ import annotations

import argparse

from ...bench.replay_cost import measure_replay_cost
from ...measure.replay import TraceError, load_trace, prepare
from ...policies import PolicyConfigError, make_policy
from ...sweep.grid import parse_budgets, parse_policies
from ..common import CliError, add_model_args, add_trace_limit_arg, load_from_args, trace_limit_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument(
        "--trace",
        default="math_h2o_vs_window",
        metavar="PRESET_OR_FILE",
        help="the trace or transcript to replay (default: the ~2k-token math derivation)",
    )
    parser.add_argument("--policy", default="h2o", help="the policy whose replay is timed")
    parser.add_argument("--budget", default="0.25", help="a fraction of the sequence (0.25) or a token count")
    parser.add_argument("--interval", type=int, default=32, help="tokens per forward = compression interval")
    parser.add_argument("--repeats", type=int, default=3)
    add_trace_limit_arg(parser)


def run(args: argparse.Namespace) -> int:
    """Time of one policy's chunked replay ÷ one plain full-cache teacher-forced pass of the same trace."""
    try:
        budgets, policies = parse_budgets(args.budget), parse_policies(args.policy)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if len(budgets) != 1 or len(policies) != 1:
        raise CliError("give exactly one --budget and one --policy (other than full)")
    budget, policy = budgets[0], policies[0]
    if not 1 <= args.interval <= 512 or args.repeats < 1:
        raise CliError("--interval must be between 1 and 512 and --repeats at least 1")
    limit = trace_limit_from_args(args)
    try:
        trace = load_trace(args.trace)
    except TraceError as exc:
        raise CliError(str(exc)) from None
    loaded = load_from_args(args)
    try:
        prompt, ids = prepare(loaded, trace, limit)
        tokens = budget.tokens(len(prompt.ids) + len(ids))
        make_policy(policy, budget=tokens, interval=args.interval)
    except (TraceError, PolicyConfigError) as exc:
        raise CliError(str(exc)) from None
    result = measure_replay_cost(loaded, prompt, ids, policy, tokens, args.interval, args.repeats)
    print(
        f"model: {loaded.name} ({loaded.quantization}, {loaded.device}); trace {trace.name}: "
        f"{len(prompt.ids)} prompt + {result.tokens} trace tokens"
    )
    print(f"replay ({policy}, budget {tokens}, interval {args.interval}, scoring on): {result.replay_seconds:7.2f} s")
    print(f"plain full-cache pass, one forward:                  {result.one_pass_seconds:7.2f} s")
    print(f"plain full-cache pass, {args.interval}-token chunks:            {result.chunked_pass_seconds:7.2f} s")
    print(f"replay-cost ratio (replay / one plain pass, best of {args.repeats}): {result.ratio:.3f}  (target <= 2.0)")
    print(f"replay / plain pass over the same chunks:            {result.chunked_ratio:.3f}")
    return 0
