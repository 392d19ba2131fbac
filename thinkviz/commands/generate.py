"""``python -m thinkviz generate``: stream a policy-evicted generation to the terminal."""

from __future__ import annotations

import argparse
import sys

from ..text.chat import REASONING_SYSTEM_PROMPT, build_chat
from ..text.reasoning import reasoning_format
from ..core.engine import DecodeSettings, EngineError, Run
from ..core.faults import guard_frames
from ..memory import with_device_memory
from ..units import format_bytes
from .common import (
    CliError,
    add_kv_quant_args,
    add_model_args,
    add_policy_args,
    command,
    kv_quant_from_args,
    load_from_args,
    policy_from_args,
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the user's question")
    add_policy_args(parser)
    add_kv_quant_args(parser)
    add_model_args(parser)
    parser.add_argument("--system", default=None, help="system prompt (default: the reasoning prompt)")
    parser.add_argument(
        "--no-thinking",
        action="store_true",
        help="for a model whose template has enable_thinking (Qwen3): switch thinking off",
    )
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", default=None, help="write the RunRecord to PATH.json + PATH.npz")


@command("generate", configure)
def run(args: argparse.Namespace) -> int:
    """Generate text through an eviction policy and print a summary."""
    if not args.prompt.strip():
        raise CliError("the prompt is empty")
    policy = policy_from_args(args)
    kv_quant = kv_quant_from_args(args)
    settings = DecodeSettings(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    try:
        settings.validate()
    except EngineError as exc:
        raise CliError(str(exc)) from None
    loaded = load_from_args(args)
    system = REASONING_SYSTEM_PROMPT if args.system is None else args.system
    reasoning = reasoning_format(loaded.tokenizer, enable_thinking=not args.no_thinking)
    prompt = build_chat(loaded.tokenizer, system or None, args.prompt, reasoning=reasoning)
    try:
        engine_run = Run(loaded, policy, prompt, settings, kv_quant=kv_quant)
        sys.stdout.write(prompt.assistant_prefix)
        events = with_device_memory(engine_run.generate(), loaded.device)  # recorded per step
        for event in guard_frames(events, f"the {policy.name} run", loaded.device, passthrough=(EngineError,)):
            sys.stdout.write(event.text)
            sys.stdout.flush()
    except EngineError as exc:
        raise CliError(str(exc)) from None
    record = engine_run.record
    s = record.summary
    print(
        f"\n--- {s['new_tokens']} tokens, {s['tokens_per_second']:.1f} tok/s, "
        f"peak KV {format_bytes(s['peak_kv_bytes'])}, final KV {format_bytes(s['final_kv_bytes'])} "
        f"(full cache at full precision {format_bytes(s['final_full_kv_bytes'])}), KV format {kv_quant.label}, "
        f"kept {s['kept_fraction']:.0%}, "
        f"stopped: {s.get('stopped', '?')}; reasoning: {prompt.reasoning.describe()}",
        file=sys.stderr,
    )
    if args.json:
        json_path, npz_path = record.save(args.json)
        print(f"recording written to {json_path} and {npz_path}", file=sys.stderr)
    return 0
