"""``python -m thinkviz bench KIND``: benchmarks that print ratios measured in one run."""

from __future__ import annotations

import argparse

from ..cli import add_model_args, command, load_from_args

BENCHES: dict[str, tuple] = {}


def bench_kind(name: str, configure):
    """Register a benchmark kind: ``configure(parser)`` and ``run(args) -> int``."""

    def decorate(run):
        BENCHES[name] = (configure, run)
        return run

    return decorate


def configure(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="kind", required=True)
    for name, (setup, run) in BENCHES.items():
        child = kinds.add_parser(name, help=(run.__doc__ or "").strip().splitlines()[0])
        setup(child)
        child.set_defaults(run=run)


def _overhead_args(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)


@bench_kind("overhead", _overhead_args)
def overhead(args: argparse.Namespace) -> int:
    """Engine tok/s (h2o, budget 128, interval 1, scoring on) ÷ plain model.generate tok/s."""
    from ..bench.overhead import measure_overhead
    from ..cli import CliError

    if args.new_tokens < 1 or args.budget < 8 or args.repeats < 1:
        raise CliError("--new-tokens and --repeats must be ≥ 1 and --budget ≥ 8")
    loaded = load_from_args(args)
    result = measure_overhead(loaded, args.new_tokens, args.budget, args.repeats)
    print(f"model: {loaded.name} ({loaded.quantization}, {loaded.device})")
    print(f"engine   (h2o, budget {args.budget}, interval 1, scoring on): {result.engine_tokens_per_second:7.2f} tok/s")
    print(f"baseline (model.generate, full cache):                   {result.generate_tokens_per_second:7.2f} tok/s")
    print(f"overhead ratio (engine / generate, {result.new_tokens} new tokens): {result.ratio:.3f}  (target >= 0.85)")
    return 0


@command("bench", configure)
def bench(args: argparse.Namespace) -> int:
    """Run a benchmark (overhead, sweep, replay-cost, …); each prints a measured ratio."""
    return args.run(args)
