"""The grid ``bench sweep`` and ``bench scale`` share: its arguments (traces × budgets × KV formats,
the policies each group replays), its checks before any model loads, and its run with a progress
bar over the groups."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from tqdm import tqdm

from ...core.engine import EngineError
from ...measure.replay import TraceError, load_trace
from ...policies import PolicyConfigError
from ...sweep.grid import (
    SweepSettings,
    check_params,
    check_vary,
    parse_budgets,
    parse_kv_quants,
    parse_policies,
    parse_vary,
    plan_groups,
)
from ...sweep.runner import GroupsProgress, SweepOutcome, open_executor, run_groups
from ...sweep.store import GroupStore
from ...sweep.work import ModelSpec, WorkerError
from ..common import (
    CliError,
    add_kv_quant_args,
    add_model_args,
    add_param_arg,
    add_protect_args,
    add_trace_limit_arg,
    trace_limit_from_args,
)


def add_grid_args(parser: argparse.ArgumentParser) -> None:
    """The model and the grid: traces × budgets (the groups) and the policies each group replays."""
    add_model_args(parser)
    parser.add_argument(
        "--trace",
        action="extend",
        nargs="+",
        required=True,
        metavar="PRESET_OR_FILE",
        help="a preset name (its system prompt, question and trace; not its knobs), "
        "a UTF-8 trace file or a transcript (.json, .jsonl, ROLE: lines); repeatable",
    )
    parser.add_argument(
        "--policies",
        default="all",
        help="comma-separated policy names, or 'all'; a name may carry its own knobs, tam:compaction=match",
    )
    parser.add_argument(
        "--budgets", default="0.1,0.25,0.5", help="fractions of the sequence's tokens (0.25) and/or token counts (256)"
    )
    parser.add_argument(
        "--budget-mode",
        choices=("tokens", "fraction"),
        default="tokens",
        help="tokens: a fraction is that share of the whole sequence, as a token budget from the "
        "start; fraction: that share of the tokens seen so far, at every step",
    )
    parser.add_argument("--interval", type=int, default=32, help="tokens per forward = compression interval")
    add_param_arg(parser, "a policy knob, given to every selected policy that declares it (repeatable)")
    parser.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KNOB=V1,V2,...",
        help="run each selected policy that declares KNOB once per value, e.g. --vary "
        "recent=16,32,64,128 (repeatable: every combination; rows say which in 'knobs')",
    )
    add_protect_args(parser)
    parser.add_argument(
        "--question",
        default=None,
        help="the question for trace files (presets bring their own; "
        "for a transcript it replaces the first user message)",
    )
    parser.add_argument(
        "--system",
        default=None,
        help="system prompt for trace files (default: the reasoning prompt; "
        "for a transcript it replaces its system message)",
    )
    add_trace_limit_arg(parser)
    add_kv_quant_args(parser, several=True)


@dataclasses.dataclass(frozen=True)
class Grid:
    settings: SweepSettings
    groups: list
    spec: ModelSpec
    kv_quants: list


def plan_grid(args: argparse.Namespace) -> Grid:
    """The grid the arguments name, checked before any model loads; :class:`CliError` otherwise."""
    try:
        budgets = parse_budgets(args.budgets, running=args.budget_mode == "fraction")
        policies = parse_policies(args.policies, variants=True)
        params = dict(args.param)
        check_params(policies, params)
        kv_quants = parse_kv_quants(args.kv_quants, args.kv_residual)
        vary = parse_vary(";".join(args.vary))
        check_vary(policies, vary)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    both = sorted(set(vary) & set(params))
    if both:
        raise CliError(f"--vary and --param both set {', '.join(both)}: give each knob one way")
    if not 1 <= args.interval <= 512:
        raise CliError(f"--interval must be between 1 and 512, got {args.interval}")
    trace_limit_from_args(args)
    if args.workers is not None and args.workers < 1:
        raise CliError(f"--workers must be at least 1, got {args.workers}")
    if args.vram_cap is not None and (args.workers is not None or getattr(args, "ray_address", None) is not None):
        raise CliError("--vram-cap caps this process's model; it does not apply to Ray workers")
    params.update(protect_system=not args.no_protect_system, protect_question=not args.no_protect_question)
    try:
        traces = [load_trace(spec, args.question, args.system) for spec in args.trace]
    except TraceError as exc:
        raise CliError(str(exc)) from None
    try:
        groups = plan_groups(traces, budgets, kv_quants)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    settings = SweepSettings(tuple(policies), args.interval, params, args.max_trace_tokens, vary)
    return Grid(settings, groups, ModelSpec(args.model, args.quant, args.device, args.quant_backend), kv_quants)


def _groups_bar(bar: tqdm) -> GroupsProgress:
    def progress(done: int, total: int, name: str) -> None:
        if bar.total is None:
            bar.reset(total=total)
            bar.initial = done
        bar.update(done - bar.n)
        if name:
            bar.set_postfix_str(name, refresh=False)

    return progress


def run_grid(
    grid: Grid,
    load,
    workers: int | None,
    address: str | None,
    store: GroupStore | None = None,
    resume: bool = False,
    runs_dir: Path | None = None,
) -> tuple[SweepOutcome, float, float]:
    """Sweep ``grid`` with a progress bar over its groups (ETA included) on stderr; returns the
    outcome, the seconds to start (model or workers loaded) and the seconds for the groups."""
    started = time.perf_counter()
    with tqdm(desc="groups", unit="group", file=sys.stderr, dynamic_ncols=True, total=None) as bar:

        def tokens(name: str, done: int, total: int) -> None:
            bar.set_postfix_str(f"{name}: {done}/{total} tokens", refresh=False)

        try:
            with open_executor(load, grid.spec, workers, address, runs_dir, tokens) as executor:
                ready = time.perf_counter()
                outcome = run_groups(
                    grid.groups,
                    grid.settings,
                    executor,
                    store,
                    resume,
                    _groups_bar(bar),
                    warn=lambda message: bar.write(f"thinkviz: {message}", file=sys.stderr),
                )
                finished = time.perf_counter()
        except (TraceError, PolicyConfigError, EngineError, WorkerError) as exc:
            raise CliError(str(exc)) from None
    for failure in outcome.failures:
        print(f"thinkviz: {failure.reason} (tried twice; the other groups are complete)", file=sys.stderr)
    return outcome, ready - started, finished - ready


def sweep_meta(args: argparse.Namespace, grid: Grid, outcome: SweepOutcome) -> dict:
    first = next(outcome.results[g.name] for g in grid.groups if g.name in outcome.results)
    meta = {
        **first.model,
        "interval": args.interval,
        "budgets": args.budgets,
        "budget_mode": args.budget_mode,
        "params": grid.settings.params,
        "vary": grid.settings.vary,
        "traces": args.trace,
        "max_trace_tokens": args.max_trace_tokens,
        "kv_quants": [kv.describe() for kv in grid.kv_quants],
    }
    if outcome.failures:
        meta["failed"] = [dataclasses.asdict(failure) for failure in outcome.failures]
    return meta
