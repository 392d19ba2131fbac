"""``bench quant-speed``: the 4-bit weight backends against unquantized weights, in speed and in
fidelity on a trace."""

from __future__ import annotations

import argparse

import torch

from ...bench.quant_speed import measure_quant_speed
from ...measure.replay import TraceError, load_trace, prepare
from ...models.loading import ModelLoadError, choose_backend, load_model
from ..common import CliError


def configure(parser: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace) -> int:
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
