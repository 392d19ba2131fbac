"""``bench overhead``: the engine's decode speed against plain ``model.generate``, after a short
prompt or (``--context``) after long ones."""

from __future__ import annotations

import argparse

from ...bench.overhead import measure_context_overhead, measure_overhead
from ...core.engine import EngineError
from ...core.kvquant import KVQuant
from ...policies import PolicyConfigError, make_policy
from ..common import CliError, add_kv_quant_args, add_model_args, kv_quant_from_args, load_from_args


def configure(parser: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace) -> int:
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
