"""``python -m thinkviz models``: the GGUF models found in Ollama's store and LM Studio's folders."""

from __future__ import annotations

import argparse
import json

from ..models.stores import FoundModel, found_models, lmstudio_roots, ollama_root
from ..units import format_bytes
from .common import command


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object per model, one a line")


def _row(model: FoundModel) -> dict:
    info = model.info
    row = {"name": model.name, "path": str(model.path), "problem": model.problem}
    if info is not None:
        row.update(
            size_bytes=info.size,
            architecture=info.architecture,
            quantization=info.quantization,
            layers=info.layers,
            kv_heads=info.kv_heads,
            head_dim=info.head_dim,
            kv_bytes_per_token=info.bytes_per_token,
            max_context=info.max_context,
        )
    return row


@command("models", configure)
def run(args: argparse.Namespace) -> int:
    """List the models found where Ollama and LM Studio keep them (read from files; nothing is contacted)."""
    models = found_models()
    if args.json:
        for model in models:
            print(json.dumps(_row(model)))
        return 0
    places = [str(ollama_root()), *map(str, lmstudio_roots())]
    if not models:
        print(f"no GGUF models found (looked in {', '.join(places)})")
        return 0
    width = max(len(m.name) for m in models)
    for model in models:
        info = model.info
        if info is None:
            print(f"{model.name:<{width}}  cannot load: {model.problem}")
            continue
        print(
            f"{model.name:<{width}}  {format_bytes(info.size):>9}  {info.architecture:<8} {info.quantization:<7} "
            f"{info.layers} layers, {info.kv_heads}/{info.q_heads} kv/q heads, "
            f"KV {format_bytes(info.bytes_per_token)}/token"
        )
    print(f"use one with --model NAME (looked in {', '.join(places)})")
    return 0
