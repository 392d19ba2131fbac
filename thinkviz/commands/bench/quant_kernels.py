"""``bench quant-kernels``: one linear layer per weight shape of a model, in each 4-bit kernel."""

from __future__ import annotations

import argparse

import torch

from ...bench.quant_kernels import KERNELS, measure_kernels, model_shapes
from ...models.loading import ModelLoadError, load_model
from ..common import CliError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="embedded", help="whose linear shapes to time (loaded unquantized)")
    parser.add_argument(
        "--rows", default="1,32", help="activation rows per call: 1 = a decode step, 32 = a replay chunk"
    )
    parser.add_argument("--repeats", type=int, default=5)


def run(args: argparse.Namespace) -> int:
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
