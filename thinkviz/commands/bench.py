"""``python -m thinkviz bench KIND``: benchmarks that print ratios measured in one run."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..bench.browser import BenchError, launched_app, measure, measure_play, measure_tune
from ..bench.trace_profile import breakdown_lines, long_task_breakdown
from ..bench.gpu import gpu_report, markdown, write_report
from ..bench.load import load, load_table
from ..bench.overhead import measure_context_overhead, measure_overhead
from ..bench.profile import profile_decode
from ..bench.quant_kernels import KERNELS, measure_kernels, model_shapes
from ..bench.quant_speed import measure_quant_speed
from ..bench.replay_cost import measure_replay_cost
from ..bench.served import served_app, short_replay
from ..bench.soak import soak, soak_table
from ..bench.summary import SummaryError, load_sweep_rows, select_runs, summary_table
from ..cores import AUTO, TORCH, choose_threads, usable_cores
from ..models.loading import ModelLoadError, choose_backend, load_model
from ..policies import PolicyConfigError, make_policy
from ..demos.presets import MAX_NEW_TOKENS_RANGE, list_presets, load_preset
from ..demos.record import recording_problem
from ..measure.replay import TraceError, load_trace, prepare
from ..core.engine import EngineError
from ..core.kvquant import KVQuant
from ..sweep.grid import (
    SweepSettings,
    check_params,
    check_vary,
    markdown_table,
    parse_budgets,
    parse_kv_quants,
    parse_policies,
    parse_vary,
    plan_groups,
    write_rows,
)
from ..sweep.runner import GroupsProgress, SweepOutcome, open_executor, run_groups
from ..sweep.store import GroupStore
from ..sweep.work import ModelSpec, WorkerError
from .common import (
    CliError,
    add_kv_quant_args,
    add_model_args,
    command,
    kv_quant_from_args,
    load_from_args,
    parse_param,
)

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
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens decoded (default 512; 128 with --context)")
    parser.add_argument("--budget", type=int, default=None, help="h2o's budget (default 128; 512 with --context)")
    parser.add_argument("--repeats", type=int, default=None, help="alternations (default 2; 1 with --context)")
    parser.add_argument(
        "--context",
        default=None,
        metavar="L1,L2,...",
        help="prompt lengths in tokens: time decoding after a prompt that long, one ratio each",
    )
    parser.add_argument("--interval", type=int, default=1, help="compression interval of the engine run")
    parser.add_argument("--policy", default="h2o", help="the policy the engine runs (default h2o)")
    parser.add_argument(
        "--no-scoring",
        action="store_true",
        help="do not compute the per-token scores the views show (what a sweep does)",
    )
    add_kv_quant_args(parser)


def _parse_contexts(text: str) -> list[int]:
    try:
        contexts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CliError(f"--context takes comma-separated token counts, got {text!r}") from None
    if not contexts or min(contexts) < 16:
        raise CliError(f"--context lengths must be at least 16 tokens, got {text!r}")
    return contexts


def _print_overhead(result, policy: str, budget: int, interval: int, scoring: bool, kv_quant: KVQuant) -> None:
    engine = result.engine_tokens_per_second
    setup = f"{policy}, budget {budget}, interval {interval}, scoring {'on' if scoring else 'off'}"
    print(f"engine   ({setup}, {result.attention} attention): {engine:7.2f} tok/s")
    print(
        f"baseline (model.generate, full cache, {result.attention} attention): "
        f"{result.generate_tokens_per_second:7.2f} tok/s"
    )
    print(f"overhead ratio (engine / generate, {result.new_tokens} new tokens): {result.ratio:.3f}  (target >= 0.85)")
    print(
        f"per CPU second: engine {result.engine_cpu_tokens_per_second:.2f}, generate "
        f"{result.generate_cpu_tokens_per_second:.2f} tok/s, ratio {result.cpu_ratio:.3f}  (waits for a busy core "
        f"left out)"
    )
    if result.kv_quant_ratio is not None:
        print(
            f"engine with the KV cache in {kv_quant.label}:                "
            f"{result.quantized_tokens_per_second:7.2f} tok/s"
        )
        print(
            f"KV-format ratio (engine {kv_quant.label} / engine full precision): {result.kv_quant_ratio:.3f}  "
            "(target >= 0.7 on the CPU)"
        )


@bench_kind("overhead", _overhead_args)
def overhead(args: argparse.Namespace) -> int:
    """Engine tok/s (a policy, default h2o, interval 1, scoring on) ÷ plain model.generate tok/s; --context for long
    prompts."""
    contexts = _parse_contexts(args.context) if args.context is not None else None
    long = contexts is not None
    new_tokens = args.new_tokens or (128 if long else 512)
    budget = args.budget or (512 if long else 128)
    repeats = args.repeats or (1 if long else 2)
    if new_tokens < 2 or budget < 8 or repeats < 1 or args.interval < 1:
        raise CliError("--new-tokens must be ≥ 2, --repeats and --interval ≥ 1 and --budget ≥ 8")
    try:
        make_policy(args.policy, budget=budget, interval=args.interval)
    except PolicyConfigError as exc:
        raise CliError(str(exc)) from None
    kv_quant = kv_quant_from_args(args)
    if long and kv_quant.spec.quantized:
        raise CliError("--kv-quant times the short-prompt engine; leave it out with --context")
    loaded = load_from_args(args)
    print(f"model: {loaded.name} ({loaded.quantization}, {loaded.backend}, {loaded.device})")
    if not long:
        scoring = not args.no_scoring
        try:
            result = measure_overhead(
                loaded, new_tokens, budget, repeats, args.interval, args.policy, scoring, kv_quant
            )
        except EngineError as exc:
            raise CliError(str(exc)) from None
        _print_overhead(result, args.policy, budget, args.interval, scoring, kv_quant)
        return 0
    if max(contexts) + new_tokens > loaded.geometry.max_context:
        raise CliError(
            f"--context {max(contexts)} + --new-tokens {new_tokens} exceeds the model's context "
            f"({loaded.geometry.max_context})"
        )
    try:
        results = measure_context_overhead(loaded, contexts, new_tokens, budget, args.interval, repeats)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(
        f"engine: h2o, budget {budget}, interval {args.interval}, scoring on (eager attention); baseline: "
        f"model.generate, full cache, SDPA attention; {new_tokens} new tokens, decode timed after the first; "
        f"best of {repeats}"
    )
    print(
        "| prompt tokens | engine prefill s | generate prefill s | engine decode tok/s | generate decode tok/s "
        "| ratio |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r.context} | {r.engine_prefill_seconds:.1f} | {r.generate_prefill_seconds:.1f} | "
            f"{r.engine_tokens_per_second:.2f} | {r.generate_tokens_per_second:.2f} | {r.ratio:.2f} |"
        )
    return 0


def _profile_args(parser: argparse.ArgumentParser) -> None:
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


@bench_kind("profile", _profile_args)
def profile(args: argparse.Namespace) -> int:
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


def _quant_speed_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="embedded", help="'embedded', a Hugging Face id or a local folder")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--trace",
        default="math_h2o_vs_window",
        metavar="PRESET_OR_FILE",
        help="the trace for the chunked pass and the quality columns",
    )
    parser.add_argument("--trace-tokens", type=int, default=512, help="use the first N tokens of the trace")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens decoded per timing")
    parser.add_argument("--chunk", type=int, default=32, help="tokens per forward in the chunked pass")
    parser.add_argument("--repeats", type=int, default=3)


@bench_kind("quant-speed", _quant_speed_args)
def quant_speed(args: argparse.Namespace) -> int:
    """4-bit backends ÷ unquantized: decode and chunked-pass tok/s, NLL, KL and top-1 on a trace."""
    if min(args.trace_tokens, args.new_tokens, args.chunk, args.repeats) < 1:
        raise CliError("--trace-tokens, --new-tokens, --chunk and --repeats must be at least 1")
    try:
        trace = load_trace(args.trace)
    except TraceError as exc:
        raise CliError(str(exc)) from None
    ways = {"float": ("none", "auto"), "bitsandbytes": ("4bit", "bitsandbytes"), "torch-int4": ("4bit", "torch-int4")}
    contenders, skipped = {}, []
    for label, (quantization, backend) in ways.items():
        try:
            contenders[label] = load_model(args.model, quantization, args.device, backend=backend)
        except ModelLoadError as exc:
            if label == "float":
                raise CliError(str(exc)) from None
            skipped.append(f"{label}: skipped ({exc})")
    reference = contenders["float"]
    try:
        prompt, ids = prepare(reference, trace, args.trace_tokens)
    except TraceError as exc:
        raise CliError(str(exc)) from None
    results = measure_quant_speed(contenders, prompt.ids, ids, args.new_tokens, args.chunk, args.repeats)
    auto = choose_backend("4bit", "auto", reference.device)
    print(
        f"model: {reference.name} on {reference.device}; auto picks {auto} here "
        f"(PyTorch CPU capability {torch.backends.cpu.get_cpu_capability()})"
    )
    print(
        f"decode: {args.new_tokens} greedy tokens (model.generate); chunked: {len(prompt.ids)} prompt + "
        f"{len(ids)} trace tokens ({trace.name}) in {args.chunk}-token forwards; best of {args.repeats}"
    )
    base = results[0]
    print(
        "| weights | backend | MB | decode tok/s | ÷ float | chunked tok/s | ÷ float | NLL | KL vs float "
        "| top-1 vs float |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r.label} | {r.backend} | {r.weights_bytes / 1e6:.0f} | {r.decode_tokens_per_second:.2f} | "
            f"{r.decode_tokens_per_second / base.decode_tokens_per_second:.2f} | {r.chunked_tokens_per_second:.1f} | "
            f"{r.chunked_tokens_per_second / base.chunked_tokens_per_second:.2f} | {r.nll:.4f} | {r.kl:.4f} "
            f"| {r.top1:.3f} |"
        )
    by_label = {r.label: r for r in results}
    if {"bitsandbytes", "torch-int4"} <= by_label.keys():
        fast, nf4 = by_label["torch-int4"], by_label["bitsandbytes"]
        print(
            f"torch-int4 ÷ bitsandbytes: decode {fast.decode_tokens_per_second / nf4.decode_tokens_per_second:.2f}, "
            f"chunked {fast.chunked_tokens_per_second / nf4.chunked_tokens_per_second:.2f}; "
            f"NLL {100 * (fast.nll / nf4.nll - 1):+.1f} % against NF4"
        )
    for line in skipped:
        print(line)
    return 0


def _quant_kernels_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="embedded", help="whose linear shapes to time (loaded unquantized)")
    parser.add_argument(
        "--rows", default="1,32", help="activation rows per call: 1 = a decode step, 32 = a replay chunk"
    )
    parser.add_argument("--repeats", type=int, default=5)


@bench_kind("quant-kernels", _quant_kernels_args)
def quant_kernels(args: argparse.Namespace) -> int:
    """One linear per weight shape: float32, bitsandbytes NF4 and torch-int4 µs per call on the CPU."""
    try:
        rows = tuple(int(part) for part in args.rows.split(","))
    except ValueError:
        raise CliError(f"--rows takes comma-separated counts, got {args.rows!r}") from None
    if not rows or min(rows) < 1 or args.repeats < 1:
        raise CliError("--rows and --repeats must be at least 1")
    try:
        loaded = load_model(args.model, "none", "cpu")
    except ModelLoadError as exc:
        raise CliError(str(exc)) from None
    results = measure_kernels(model_shapes(loaded.model), rows, args.repeats)
    print(
        f"model shapes: {loaded.name}; PyTorch CPU capability {torch.backends.cpu.get_cpu_capability()}; "
        f"µs per call, best of {args.repeats}; the last shape is the output head (int8 in torch-int4)"
    )
    print("| N × K | rows | " + " | ".join(KERNELS) + " | torch-int4 speed-up over float32 | over NF4 |")
    print("|---|---:|" + "---:|" * (len(KERNELS) + 2))
    for r in results:
        cells = [f"{r.microseconds[k]:.0f}" if k in r.microseconds else "–" for k in KERNELS]
        fast = r.microseconds.get("torch-int4")
        speedups = [
            f"{r.microseconds[base] / fast:.2f}×" if fast and base in r.microseconds else "–"
            for base in ("float32", "bitsandbytes NF4")
        ]
        print(f"| {r.out_features} × {r.in_features} | {r.rows} | " + " | ".join(cells + speedups) + " |")
    return 0


def _grid_args(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument(
        "--param",
        type=parse_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a policy knob, given to every selected policy that declares it (repeatable)",
    )
    parser.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KNOB=V1,V2,...",
        help="run each selected policy that declares KNOB once per value, e.g. --vary "
        "recent=16,32,64,128 (repeatable: every combination; rows say which in 'knobs')",
    )
    parser.add_argument("--no-protect-system", action="store_true", help="allow evicting the system prompt")
    parser.add_argument("--no-protect-question", action="store_true", help="allow evicting the question")
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
    parser.add_argument(
        "--max-trace-tokens",
        type=int,
        default=None,
        metavar="N",
        help="replay only the first N tokens of each trace (a cheaper subset)",
    )
    add_kv_quant_args(parser, several=True)


def _sweep_args(parser: argparse.ArgumentParser) -> None:
    _grid_args(parser)
    parser.add_argument(
        "--out",
        default=None,
        help="folder for sweep.csv, sweep.json, pareto.html, timings.csv and groups/ (default sweep-out)",
    )
    parser.add_argument(
        "--resume",
        default=None,
        metavar="OUT",
        help="continue the sweep in OUT: groups already in OUT/groups/ are kept, damaged ones and the rest computed",
    )
    parser.add_argument("--save-runs", action="store_true", help="also save every run's recording into OUT/runs/")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="run the groups on a local Ray runtime of N workers, one model each "
        "(with --ray-address: N workers on that cluster; needs 'pip install ray')",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="run the groups on the Ray cluster at ADDR (e.g. 10.0.0.5:6379)",
    )


@dataclasses.dataclass(frozen=True)
class _Grid:
    settings: SweepSettings
    groups: list
    spec: ModelSpec
    kv_quants: list


def _grid(args: argparse.Namespace) -> _Grid:
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
    if args.max_trace_tokens is not None and args.max_trace_tokens < 1:
        raise CliError(f"--max-trace-tokens must be at least 1, got {args.max_trace_tokens}")
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
    return _Grid(settings, groups, ModelSpec(args.model, args.quant, args.device, args.quant_backend), kv_quants)


def _groups_bar(bar: tqdm) -> GroupsProgress:
    def progress(done: int, total: int, name: str) -> None:
        if bar.total is None:
            bar.reset(total=total)
            bar.initial = done
        bar.update(done - bar.n)
        if name:
            bar.set_postfix_str(name, refresh=False)

    return progress


def _run_grid(
    grid: _Grid,
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


def _sweep_meta(args: argparse.Namespace, grid: _Grid, outcome: SweepOutcome) -> dict:
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


@bench_kind("sweep", _sweep_args)
def sweep(args: argparse.Namespace) -> int:
    """Replay traces through policies × budgets; write CSV, JSON and a memory-vs-fidelity Pareto plot."""
    if args.resume is not None and args.out is not None and Path(args.out) != Path(args.resume):
        raise CliError(f"--resume {args.resume} continues the sweep in that folder; leave out --out {args.out}")
    grid = _grid(args)
    out = Path(args.resume or args.out or "sweep-out")
    store = GroupStore(out, grid.settings, dataclasses.asdict(grid.spec))
    outcome, start_seconds, seconds = _run_grid(
        grid,
        lambda: load_from_args(args),
        args.workers,
        args.ray_address,
        store,
        args.resume is not None,
        out / "runs" if args.save_runs else None,
    )
    rows = outcome.rows(grid.groups)
    if not rows:
        return 1
    paths = write_rows(rows, out, _sweep_meta(args, grid, outcome))
    print(markdown_table(rows), end="")
    computed = len(outcome.results) - outcome.reused
    print(
        f"groups: {len(outcome.results)} of {len(grid.groups)} finished ({outcome.reused} reused from "
        f"{out / 'groups'}, {computed} computed in {start_seconds + seconds:.1f} s), {len(outcome.failures)} failed"
    )
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return 1 if outcome.failures else 0


def _scale_args(parser: argparse.ArgumentParser) -> None:
    _grid_args(parser)
    parser.add_argument("--workers", type=int, default=2, metavar="N", help="local Ray workers (default 2)")


@bench_kind("scale", _scale_args)
def scale(args: argparse.Namespace) -> int:
    """The same sweep grid in this process, then on N local Ray workers: wall-clock speed-up, per-group times."""
    grid = _grid(args)
    started = time.perf_counter()
    loaded = load_from_args(args)
    load_seconds = time.perf_counter() - started
    runs = {}
    for label, workers in (("in-process", None), (f"{args.workers} Ray workers", args.workers)):
        outcome, start_seconds, seconds = _run_grid(grid, lambda: loaded, workers, None)
        if outcome.failures:
            raise CliError(f"{len(outcome.failures)} groups failed in the {label} run; see above")
        runs[label] = (outcome, start_seconds + (load_seconds if workers is None else 0.0), seconds)
    (local, local_start, local_seconds), (ray_run, ray_start, ray_seconds) = runs.values()
    with tempfile.TemporaryDirectory(prefix="thinkviz-scale-") as tmp:
        files = [
            write_rows(outcome.rows(grid.groups), Path(tmp) / str(i), _sweep_meta(args, grid, outcome))
            for i, (outcome, _, _) in enumerate(runs.values())
        ]
        first, second = files
        same = all(first[key].read_bytes() == second[key].read_bytes() for key in ("csv", "json"))
    groups = len(grid.groups)
    alone = sum(group.budget is None for group in grid.groups)
    print(
        f"grid: {groups} groups ({len(grid.settings.variants())} policy runs + the full cache each; {alone} of them "
        f"the full cache in a quantized format alone); model {grid.spec.name}; this process runs "
        f"{torch.get_num_threads()} threads, each worker 1"
    )
    print("| run | start s | groups s | total s | wall s per group | groups per hour |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, (_, start_seconds, seconds) in runs.items():
        print(
            f"| {label} | {start_seconds:.1f} | {seconds:.1f} | {start_seconds + seconds:.1f} | "
            f"{seconds / groups:.2f} | {3600 * groups / seconds:.0f} |"
        )
    print(
        f"speed-up over the groups ({args.workers} workers ÷ in-process): {local_seconds / ray_seconds:.2f}  "
        "(target >= 1.6)"
    )
    print(f"speed-up including start-up: {(local_start + local_seconds) / (ray_start + ray_seconds):.2f}")
    print(f"sweep.csv and sweep.json identical: {'yes' if same else 'NO'}")
    print("| group | replay s in-process | replay s on a worker |")
    print("|---|---:|---:|")
    for group in grid.groups:
        print(f"| {group.name} | {local.results[group.name].seconds:.2f} | {ray_run.results[group.name].seconds:.2f} |")
    return 0 if same else 1


def _summary_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sweeps", nargs="+", metavar="SWEEP", help="a sweep.json, or a folder written by bench sweep --out"
    )
    parser.add_argument("--metric", default="nll_delta", help="nll_delta (default), kl or top1")
    parser.add_argument(
        "--policies", default=None, help="comma-separated runs to keep, as the table names them (default: every run)"
    )
    parser.add_argument(
        "--out", default=None, help="also write summary.md and one Pareto figure with a panel per trace here"
    )


@bench_kind("summary", _summary_args)
def summary(args: argparse.Namespace) -> int:
    """Line up several sweeps: one row per (policy, budget), one column per trace."""
    try:
        rows = load_sweep_rows(args.sweeps)
        if args.policies is not None:
            rows = select_runs(rows, [name.strip() for name in args.policies.split(",") if name.strip()])
        table = summary_table(rows, args.metric)
    except SummaryError as exc:
        raise CliError(str(exc)) from None
    print(table, end="")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.md").write_text(table, encoding="utf-8")
        from ..viz.pareto import pareto_figure  # plotly, here only: the CLI must import without it (bench gpu)

        pareto_figure(rows, args.metric).write_html(out / "pareto.html", include_plotlyjs=True)
        print(f"written: {out / 'summary.md'}, {out / 'pareto.html'}")
    return 0


def _replay_cost_args(parser: argparse.ArgumentParser) -> None:
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


@bench_kind("replay-cost", _replay_cost_args)
def replay_cost(args: argparse.Namespace) -> int:
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
    try:
        trace = load_trace(args.trace)
    except TraceError as exc:
        raise CliError(str(exc)) from None
    loaded = load_from_args(args)
    try:
        prompt, ids = prepare(loaded, trace)
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


def _browser_args(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument("--tokens", type=int, default=500, help="tokens to generate in the Live tab")
    parser.add_argument("--url", default=None, help="measure an app already running there instead of starting app.py")
    parser.add_argument(
        "--threads",
        default=AUTO,
        metavar="T1,T2,...",
        help=f"torch threads of the app started, one run each: numbers, {AUTO!r} (the app's "
        f"choice) and {TORCH!r} (torch's default: one per core), e.g. {TORCH},{AUTO}",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="TRACE.json",
        help="record the run as a Chromium performance trace in TRACE.json (open it in Chrome's "
        "Performance panel) and print what the main-thread long tasks spent their time on",
    )
    parser.add_argument(
        "--play",
        default=None,
        metavar="PRESET",
        help="time a preset's committed recording instead: in Live, 'Play recording' as fast as it "
        "draws, from the click to its first painted token (target <= 2 s) and to its end",
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="time the tuning loop instead: in Live, a preset's first --tune-tokens trace tokens "
        "measured against the full cache; each --tune-vary value set by hand, then Generate, "
        "to the new ΔNLL on screen (target <= 10 s)",
    )
    parser.add_argument("--tune-preset", default="math_h2o_vs_window", help="the replay preset --tune runs")
    parser.add_argument("--tune-tokens", type=int, default=512, help="trace tokens --tune replays")
    parser.add_argument(
        "--tune-vary",
        default="recent=16,64",
        metavar="KNOB=V1,V2,...",
        help="the knob of the preset's policy --tune changes, and the values it sets in turn",
    )


def _thread_counts(text: str) -> list[tuple[str, int]]:
    """``"torch,auto"`` → ``[("torch", 2), ("auto", 1)]`` on two cores: explicit counts, whatever
    OMP_NUM_THREADS this process runs with (the app started for each run gets its count)."""
    out = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        try:
            threads = usable_cores() if item == TORCH else choose_threads(item, env={})
        except ValueError as exc:
            raise CliError(f"--threads: {exc}") from None
        out.append((item, threads))
    if not out:
        raise CliError("--threads needs at least one setting")
    return out


def _tune(args: argparse.Namespace, settings: list[tuple[str, int]]) -> int:
    """``bench browser --tune``: the seconds from a knob's change to the new ΔNLL on screen."""
    if args.tune_preset not in list_presets():
        raise CliError(f"--tune-preset: unknown preset {args.tune_preset!r}; available: {', '.join(list_presets())}")
    preset = load_preset(args.tune_preset)
    if preset.mode != "replay":
        raise CliError(f"--tune-preset: {args.tune_preset} generates; --tune needs a replay preset")
    try:
        vary = parse_vary(args.tune_vary)
        check_vary([preset.policy], vary)
    except ValueError as exc:
        raise CliError(f"--tune-vary: {exc}") from None
    if len(vary) != 1:
        raise CliError("--tune-vary changes one knob: KNOB=V1,V2,...")
    if args.tune_tokens < 1:
        raise CliError(f"--tune-tokens must be at least 1, got {args.tune_tokens}")
    ((knob, values),) = vary.items()
    for label, threads in settings:
        try:
            if args.url:
                cycles = measure_tune(args.url, args.tune_preset, args.tune_tokens, knob, values)
            else:
                with launched_app(_app_args(args, threads)) as url:
                    cycles = measure_tune(url, args.tune_preset, args.tune_tokens, knob, values)
        except BenchError as exc:
            raise CliError(str(exc)) from None
        where = "" if args.url else f", torch threads {threads} ({label})"
        print(
            f"Live tab, {args.tune_preset} ({preset.policy}), first {args.tune_tokens} trace tokens measured "
            f"against the full cache{where}"
        )
        for cycle in cycles:
            print(
                f"{knob} -> {cycle.value:>6}: change -> new ΔNLL on screen {cycle.seconds:6.1f} s "
                f"(target <= 10 s); ΔNLL {cycle.nll_delta}, KL {cycle.kl}"
            )
    return 0


def _play(args: argparse.Namespace) -> int:
    """``bench browser --play PRESET``: how soon a preset's recording shows in the Live tab."""
    if args.play not in list_presets():
        raise CliError(f"--play: unknown preset {args.play!r}; available: {', '.join(list_presets())}")
    problem = recording_problem(args.play)
    if problem is not None:
        raise CliError(f"--play: {problem}")
    try:
        if args.url:
            result = measure_play(args.url, args.play)
        else:
            device = ["--device", args.device] if args.device else []
            with launched_app(
                ["--model", args.model, "--quant", args.quant, "--quant-backend", args.quant_backend, *device]
            ) as url:
                result = measure_play(url, args.play)
    except BenchError as exc:
        raise CliError(str(exc)) from None
    print(f"Live tab, {args.play}'s recording played as fast as it draws (no model needed)")
    print(f"click -> first token painted:     {result.first_token_painted:6.2f} s  (target <= 2 s)")
    print(f"click -> the end on screen:        {result.done:6.2f} s  (the status polled every 0.25 s)")
    print(f"status: {result.status.splitlines()[0] if result.status else ''}")
    return 0


def _app_args(args: argparse.Namespace, threads: int) -> list[str]:
    """``app.py``'s arguments for a bench browser run: the model as asked for, torch on ``threads``."""
    device = ["--device", args.device] if args.device else []
    return [
        "--model",
        args.model,
        "--quant",
        args.quant,
        "--quant-backend",
        args.quant_backend,
        *device,
        "--threads",
        str(threads),
    ]


@bench_kind("browser", _browser_args)
def browser(args: argparse.Namespace) -> int:
    """Headless Chromium: click → first painted token, frames per second and long tasks during a long Live run."""
    low, high = MAX_NEW_TOKENS_RANGE  # what the Live tab's slider allows
    if not low <= args.tokens <= high:
        raise CliError(f"--tokens must be between {low} and {high}, got {args.tokens}")
    settings = _thread_counts(args.threads)
    if args.tune:
        return _tune(args, settings)
    if args.play is not None:
        return _play(args)
    if args.url and len(settings) > 1:
        raise CliError("--threads with several settings starts the app for each; it cannot measure --url")
    if args.profile is not None and len(settings) > 1:
        raise CliError("--profile traces one run: give one --threads setting")
    results = []
    try:
        for label, threads in settings:
            if args.url:
                results.append((label, None, measure(args.url, args.tokens, trace=args.profile)))
                continue
            with launched_app(_app_args(args, threads)) as url:
                results.append((label, threads, measure(url, args.tokens, trace=args.profile)))
    except BenchError as exc:
        raise CliError(str(exc)) from None
    for label, threads, result in results:
        where = "" if threads is None else f", torch threads {threads} ({label})"
        print(
            f"Live tab, h2o, {result.new_tokens} new tokens{where}; "
            f"the app reports {result.app_tokens_per_second} tok/s"
        )
        print(f"click -> prompt painted:          {result.prompt_painted:6.2f} s")
        print(f"click -> first generated token:   {result.first_token_painted:6.2f} s")
        print(
            f"frames painted while streaming:   {result.frames} in {result.run_seconds:.1f} s "
            f"= {result.frames_per_second:.1f} fps  (target 5-10)"
        )
        print(
            f"main-thread long tasks (>50 ms):  {result.long_tasks}, longest {result.longest_task_ms:.0f} ms, "
            f"over 200 ms: {result.tasks_over_200ms} (target 0); p95 per frame {result.task_p95_ms:.0f} ms "
            "(target <= 50)"
        )
    if args.profile is not None:
        trace = json.loads(args.profile.read_text(encoding="utf-8"))
        print(
            "\n".join(
                breakdown_lines(long_task_breakdown(trace.get("traceEvents", []) if isinstance(trace, dict) else trace))
            )
        )
        print(f"trace: {args.profile}")
    if len(results) > 1:
        base_label, _, base = results[0]
        for label, _, result in results[1:]:
            print(
                f"{label} / {base_label}: run time {result.run_seconds / base.run_seconds:.2f}, "
                f"fps {result.frames_per_second / max(base.frames_per_second, 1e-9):.2f}"
            )
    return 0


def _gpu_args(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.set_defaults(model="random:Qwen3-4B", quant="none")
    parser.add_argument("--contexts", default="2048,8192,32768", help="comma-separated prompt lengths in tokens")
    parser.add_argument("--policies", default="full,h2o", help="comma-separated policies at each context")
    parser.add_argument(
        "--budget", type=float, default=0.1, help="the evicting policies' budget: a fraction of the context"
    )
    parser.add_argument("--decode-tokens", type=int, default=32, help="tokens decoded after each prefill")
    parser.add_argument("--ratio-tokens", type=int, default=128, help="tokens per engine / model.generate run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="gpu-bench", help="folder for bench-gpu.json and bench-gpu.md")


@bench_kind("gpu", _gpu_args)
def gpu(args: argparse.Namespace) -> int:
    """On CUDA: engine ÷ model.generate tok/s (scoring on/off), prefill/decode tok/s, peak memory at long contexts."""
    if not torch.cuda.is_available():
        raise CliError("bench gpu needs a CUDA GPU, and this machine has none (torch.cuda.is_available() is False)")
    if args.device is not None and not args.device.strip().startswith("cuda"):
        raise CliError(f"bench gpu measures a CUDA device, not {args.device}")
    try:
        contexts = [int(text) for text in args.contexts.split(",") if text.strip()]
        policies = parse_policies(args.policies)
    except ValueError as exc:
        raise CliError(f"--contexts takes token counts such as 2048,8192 and --policies policy names: {exc}") from None
    if not contexts or min(contexts) < 16:
        raise CliError("--contexts needs token counts of at least 16")
    if not 0 < args.budget < 1 or args.decode_tokens < 2 or args.ratio_tokens < 1 or args.repeats < 1:
        raise CliError(
            "--budget must be in (0, 1), --decode-tokens at least 2, --ratio-tokens and --repeats at least 1"
        )
    loaded = load_from_args(args)
    if max(contexts) + args.decode_tokens > loaded.geometry.max_context:
        raise CliError(
            f"{loaded.name} has a context of {loaded.geometry.max_context} tokens; "
            f"--contexts up to {max(contexts)} plus {args.decode_tokens} decoded tokens do not fit"
        )
    report = gpu_report(
        loaded,
        contexts,
        ["full", *policies],
        args.budget,
        args.decode_tokens,
        args.ratio_tokens,
        args.repeats,
        progress=lambda message: print(f"[bench gpu] {message}", file=sys.stderr),
    )
    print(markdown(report), end="")
    paths = write_report(report, Path(args.out))
    print("written: " + ", ".join(str(p) for p in paths))
    return 0


def _served_args(parser: argparse.ArgumentParser, trace_tokens: int) -> None:
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


def _app_args(args: argparse.Namespace) -> list[str]:
    """``app.py``'s arguments for the model the benchmark was given."""
    device = ["--device", args.device] if args.device else []
    return ["--model", args.model, "--quant", args.quant, "--quant-backend", args.quant_backend, *device]


def _soak_args(parser: argparse.ArgumentParser) -> None:
    _served_args(parser, trace_tokens=650)
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


@bench_kind("soak", _soak_args)
def soak_bench(args: argparse.Namespace) -> int:
    """Server memory across N successive new sessions of M short replays: start, after 5, end, peak, per session."""
    if args.url and args.pid is None:
        raise CliError("bench soak reads the server's memory: with --url give the app's process id (--pid)")
    try:
        replay = short_replay(args.preset, args.trace_tokens, args.interval)
        with served_app(args.url, args.pid, _app_args(args)) as served:
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


def _load_args(parser: argparse.ArgumentParser) -> None:
    _served_args(parser, trace_tokens=256)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients, one replay each")


@bench_kind("load", _load_args)
def load_bench(args: argparse.Namespace) -> int:
    """K concurrent clients, one short replay each: all finish with their own result; queue wait and total time."""
    try:
        replay = short_replay(args.preset, args.trace_tokens, args.interval)
        with served_app(args.url, None, _app_args(args)) as served:
            result = load(served, replay, args.clients)
    except BenchError as exc:
        raise CliError(str(exc)) from None
    print(load_table(result), end="")
    return 0


@command("bench", configure)
def bench(args: argparse.Namespace) -> int:
    """Run a benchmark (overhead, sweep, replay-cost, …); each prints a measured ratio."""
    return args.run(args)
