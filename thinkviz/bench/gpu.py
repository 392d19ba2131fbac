"""The GPU benchmark: engine ÷ ``model.generate`` throughput, prefill and decode at long contexts, peak memory.

Everything runs in one process on one loaded model (by default ``random:Qwen3-4B``: a real
geometry with random weights, so no download is needed and 32k tokens fit its context):

- *ratio*: engine tok/s ÷ ``model.generate`` tok/s on the overhead benchmark's prompt
  (h2o, budget 128, interval 1), with the per-step importance scores on and off, best of
  ``repeats`` after a warm-up (:mod:`thinkviz.bench.overhead`);
- *contexts*: for each context length and policy (``full`` and ``h2o`` at a fraction of the
  context), a prompt of that many random token ids is prefilled (in the engine's chunks,
  compressing between them; the budget is at least 64 tokens) and ``decode_tokens`` tokens
  are decoded greedily.  Prefill
  tok/s is the engine's own prefill time; decode tok/s is wall-clock over the decoded steps
  after the first.  Peak memory is ``torch.cuda.max_memory_allocated`` over the run (``None``
  on a CPU, where the functions also run, for tests).

Wall-clock readings are taken after a host-device synchronisation: each engine step reads
its token back (``int(argmax)``), and every forward with attention capture copies its
reductions to the host.
"""

from __future__ import annotations

import datetime
import json
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import transformers

from ..core.engine import DecodeSettings, Run
from ..models.loading import LoadedModel
from ..policies import make_policy
from ..units import cell
from .overhead import time_engine, time_generate

CONTEXTS = (2048, 8192, 32768)
POLICIES = ("full", "h2o")
RATIO_BUDGET = 128
MIN_BUDGET = 64  # h2o keeps a recent window of 32 beside its heavy hitters


@dataclass
class RatioRow:
    scoring: bool
    engine_tokens_per_second: float
    generate_tokens_per_second: float

    @property
    def ratio(self) -> float:
        return self.engine_tokens_per_second / self.generate_tokens_per_second


@dataclass
class ContextRow:
    policy: str
    context: int
    budget: int | None  # tokens kept per layer and kv-head; None for the full cache
    prefill_tokens_per_second: float
    decode_tokens_per_second: float
    decode_tokens: int
    final_kv_bytes: int
    peak_bytes: int | None  # torch.cuda.max_memory_allocated over the run; None off CUDA


def peak_reset(device: torch.device) -> None:
    """Start a new peak-memory reading on ``device`` (nothing to do off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device) -> int | None:
    """The most memory allocated on ``device`` since :func:`peak_reset`; ``None`` off CUDA."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device))


def random_prompt(loaded: LoadedModel, tokens: int, seed: int = 0) -> list[int]:
    """``tokens`` random ids the tokenizer has text for (above its first special ids)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, len(loaded.tokenizer), (tokens,), generator=generator).tolist()


def measure_ratio(loaded: LoadedModel, new_tokens: int, repeats: int, scoring: bool) -> RatioRow:
    """Engine vs ``model.generate`` tok/s, alternating, best of ``repeats`` after a warm-up."""
    time_engine(loaded, 8, RATIO_BUDGET, scoring=scoring)
    time_generate(loaded, 8)
    engine, baseline = [], []
    for _ in range(repeats):
        engine.append(time_engine(loaded, new_tokens, RATIO_BUDGET, scoring=scoring).wall)
        baseline.append(time_generate(loaded, new_tokens).wall)
    return RatioRow(scoring, max(engine), max(baseline))


def measure_context(
    loaded: LoadedModel, policy: str, context: int, budget_fraction: float, decode_tokens: int, seed: int = 0
) -> ContextRow:
    """Prefill ``context`` random tokens through ``policy``, then decode ``decode_tokens`` (≥ 2)."""
    if decode_tokens < 2:
        raise ValueError("decode_tokens must be at least 2 (the first step is not timed)")
    budget = None if policy == "full" else max(MIN_BUDGET, int(budget_fraction * context))
    made = make_policy(policy) if budget is None else make_policy(policy, budget=budget)
    settings = DecodeSettings(max_new_tokens=decode_tokens, stop_at_eos=False)
    run = Run(loaded, made, random_prompt(loaded, context, seed), settings)
    peak_reset(loaded.device)
    events = run.generate()
    next(events)  # prefill and the first step
    start = time.perf_counter()
    decoded = sum(1 for _ in events)
    seconds = time.perf_counter() - start
    summary = run.record.summary
    return ContextRow(
        policy=policy,
        context=context,
        budget=budget,
        prefill_tokens_per_second=context / summary["prefill_seconds"],
        decode_tokens_per_second=decoded / seconds,
        decode_tokens=decoded,
        final_kv_bytes=summary["final_kv_bytes"],
        peak_bytes=peak_bytes(loaded.device),
    )


def gpu_report(
    loaded: LoadedModel,
    contexts: Sequence[int] = CONTEXTS,
    policies: Sequence[str] = POLICIES,
    budget_fraction: float = 0.1,
    decode_tokens: int = 32,
    ratio_tokens: int = 128,
    repeats: int = 2,
    progress=lambda message: None,
) -> dict[str, Any]:
    """Every measurement of the GPU benchmark, as a JSON-ready dict (``meta``, ``ratio``, ``contexts``)."""
    ratio = []
    for scoring in (True, False):
        progress(f"engine vs model.generate, scoring {'on' if scoring else 'off'}")
        ratio.append(measure_ratio(loaded, ratio_tokens, repeats, scoring))
    rows = []
    for context in contexts:
        for policy in policies:
            progress(f"{policy} at {context} tokens of context")
            rows.append(measure_context(loaded, policy, context, budget_fraction, decode_tokens))
    return {
        "meta": _meta(loaded, budget_fraction, ratio_tokens, repeats),
        "ratio": [asdict(r) | {"ratio": r.ratio} for r in ratio],
        "contexts": [asdict(r) for r in rows],
    }


def _meta(loaded: LoadedModel, budget_fraction: float, ratio_tokens: int, repeats: int) -> dict[str, Any]:
    device = loaded.device
    meta = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "model": loaded.name,
        "quantization": loaded.quantization,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "weights_bytes": loaded.weights_bytes,
        "kv_bytes_per_token": loaded.geometry.bytes_per_token,
        "budget_fraction": budget_fraction,
        "ratio_tokens": ratio_tokens,
        "ratio_budget": RATIO_BUDGET,
        "repeats": repeats,
    }
    if device.type == "cuda":
        meta["device_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
    return meta


def markdown(report: dict[str, Any]) -> str:
    """The report as two Markdown tables, headed by what was measured on what."""
    meta = report["meta"]
    gib = 1024**3
    lines = [
        (
            f"Model {meta['model']} ({meta['quantization']}) on {meta['device_name']} ({meta['device']}), "
            f"torch {meta['torch']}, transformers {meta['transformers']}, {meta['date']}."
        ),
        "",
        "| scoring | engine tok/s | model.generate tok/s | engine ÷ generate |",
        "|---|---:|---:|---:|",
    ]
    for row in report["ratio"]:
        lines.append(
            f"| {'on' if row['scoring'] else 'off'} | {cell(row['engine_tokens_per_second'], '.1f')} "
            f"| {cell(row['generate_tokens_per_second'], '.1f')} | {cell(row['ratio'], '.3f')} |"
        )
    lines += [
        "",
        "| context | policy | budget | prefill tok/s | decode tok/s | final KV (GiB) | peak memory (GiB) |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["contexts"]:
        peak = None if row["peak_bytes"] is None else row["peak_bytes"] / gib
        lines.append(
            f"| {row['context']} | {row['policy']} | {cell(row['budget'], 'd')} "
            f"| {cell(row['prefill_tokens_per_second'], '.0f')} "
            f"| {cell(row['decode_tokens_per_second'], '.1f')} "
            f"| {cell(row['final_kv_bytes'] / gib, '.3f')} | {cell(peak, '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``out/bench-gpu.json`` and ``out/bench-gpu.md``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "bench-gpu.json", out / "bench-gpu.md"
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(markdown(report), encoding="utf-8")
    return json_path, md_path
