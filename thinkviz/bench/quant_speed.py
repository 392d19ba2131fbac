"""4-bit weights against float: decode speed, chunked-pass speed and quality, in one run.

The contenders are one model loaded several ways (unquantized, bitsandbytes NF4, torch-int4)
in one process.  Each repeat times every contender in turn, and each keeps its best, so
machine load hits all of them alike:

- *decode*: greedy ``model.generate`` of ``new_tokens`` tokens, one token per forward (what
  the Live and Compare tabs do);
- *chunked pass*: the bare model over a trace in ``chunk``-token forwards with a growing full
  cache (what replays and sweeps do, ``chunk`` = their interval).

Quality comes from one teacher-forced pass of the same trace through every contender in
lockstep, 256 tokens at a time: the mean NLL of the trace tokens, ``KL(float ‖ contender)`` and
top-1 agreement with the unquantized model, chunk by chunk, so only one chunk of logits per
contender exists at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from ..measure.metrics import kl_divergence, log_probs, token_nll, top1_agreement
from ..models.loading import LoadedModel
from .overhead import time_generate
from .replay_cost import time_plain_pass

QUALITY_CHUNK = 256


@dataclass
class ContenderResult:
    label: str
    backend: str
    weights_bytes: int
    decode_tokens_per_second: float
    chunked_tokens_per_second: float
    nll: float
    kl: float  # KL(reference ‖ this), nats per token; 0 for the reference itself
    top1: float  # share of trace tokens where this contender's arg-max equals the reference's


@torch.inference_mode()
def lockstep_quality(
    models: Sequence[LoadedModel], prompt_ids: Sequence[int], ids: Sequence[int]
) -> list[tuple[float, float, float]]:
    """``(mean NLL, mean KL vs models[0], top-1 agreement with models[0])`` of ``ids`` after ``prompt_ids``,
    per model."""
    sequence = [*prompt_ids, *ids]
    first = len(prompt_ids) - 1  # the logit row that predicts ids[0]
    caches = [DynamicCache(config=m.model.config) for m in models]
    nll = [torch.zeros(()) for _ in models]
    kl = [torch.zeros(()) for _ in models]
    agree = [torch.zeros(()) for _ in models]
    for lo in range(0, len(sequence) - 1, QUALITY_CHUNK):
        rows = range(lo, min(lo + QUALITY_CHUNK, len(sequence) - 1))
        scored = torch.tensor([r >= first for r in rows])
        targets = torch.tensor([sequence[r + 1] for r in rows])[scored]
        reference = None
        for i, (loaded, cache) in enumerate(zip(models, caches)):
            chunk = torch.tensor([sequence[rows.start : rows.stop]], device=loaded.device)
            logits = loaded.model(input_ids=chunk, cache=cache, use_cache=True).logits[0]
            lp = log_probs(logits.cpu())[scored]
            reference = lp if reference is None else reference
            nll[i] += token_nll(lp, targets).sum()
            kl[i] += kl_divergence(reference, lp).sum()
            agree[i] += top1_agreement(reference, lp).sum()
    n = len(ids)
    return [(float(a / n), float(b / n), float(c / n)) for a, b, c in zip(nll, kl, agree)]


def measure_quant_speed(
    contenders: dict[str, LoadedModel],
    prompt_ids: Sequence[int],
    ids: Sequence[int],
    new_tokens: int = 128,
    chunk: int = 32,
    repeats: int = 3,
) -> list[ContenderResult]:
    """Time and score every contender (the first is the reference); best of ``repeats`` after a warm-up."""
    labels, models = list(contenders), list(contenders.values())
    decode = {label: [] for label in labels}
    chunked = {label: [] for label in labels}
    for loaded in models:
        time_generate(loaded, 4)
        time_plain_pass(loaded, prompt_ids, ids[: 2 * chunk], chunk)
    for _ in range(repeats):
        for label, loaded in contenders.items():
            decode[label].append(time_generate(loaded, new_tokens).wall)
            chunked[label].append((len(prompt_ids) + len(ids)) / time_plain_pass(loaded, prompt_ids, ids, chunk))
    quality = lockstep_quality(models, prompt_ids, ids)
    return [
        ContenderResult(label, loaded.backend, loaded.weights_bytes, max(decode[label]), max(chunked[label]), *scores)
        for (label, loaded), scores in zip(contenders.items(), quality)
    ]
