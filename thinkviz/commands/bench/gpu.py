"""``bench gpu``: on a CUDA GPU, the engine against ``model.generate``, prefill and decode speed and
peak memory at long contexts; written as JSON and Markdown."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ...bench.gpu import gpu_report, markdown, write_report
from ...sweep.grid import parse_policies
from ..common import CliError, add_model_args, load_from_args


def configure(parser: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace) -> int:
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
