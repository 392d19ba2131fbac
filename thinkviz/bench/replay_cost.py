"""Replay cost: one policy's chunked, evicting replay vs a plain full-cache teacher-forced pass.

All timings come from one process on one loaded model, alternating, best of ``repeats``
after a warm-up, so machine noise hits every contender alike:

- *replay*: :meth:`thinkviz.core.engine.Run.replay` of the trace through the policy, ``interval``
  tokens per forward, attention captured, scores computed, cache gathered at each compression;
- *one pass*: the bare model over prompt + trace in a single forward (the cheapest way to get
  the full cache's logits) — the ratio's denominator;
- *chunked pass*: the bare model over the same ``interval``-token chunks with a growing
  full cache — isolates what the engine and the policy add from what chunking costs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from ..text.chat import ChatPrompt
from ..core.engine import DecodeSettings, Run
from ..models.loading import LoadedModel
from ..policies import make_policy


@dataclass
class ReplayCostResult:
    tokens: int
    replay_seconds: float
    one_pass_seconds: float
    chunked_pass_seconds: float

    @property
    def ratio(self) -> float:
        """Replay time ÷ one plain full-cache pass (target ≤ 2.0)."""
        return self.replay_seconds / self.one_pass_seconds

    @property
    def chunked_ratio(self) -> float:
        """Replay time ÷ the plain pass over the same chunks."""
        return self.replay_seconds / self.chunked_pass_seconds


def time_replay(
    loaded: LoadedModel, prompt: ChatPrompt, ids: Sequence[int], policy: str, budget: int, interval: int
) -> float:
    """Seconds for a whole replay (prefill included) through ``policy``."""
    run = Run(loaded, make_policy(policy, budget=budget, interval=interval), prompt, DecodeSettings())
    start = time.perf_counter()
    for _ in run.replay(ids):
        pass
    return time.perf_counter() - start


@torch.inference_mode()
def time_plain_pass(loaded: LoadedModel, prompt_ids: Sequence[int], ids: Sequence[int], chunk: int | None) -> float:
    """Seconds for the bare model over ``prompt_ids`` then ``ids`` in ``chunk``-token forwards
    (``None``: everything in one forward), full cache, logits of every trace token."""
    model, device = loaded.model, loaded.device
    start = time.perf_counter()
    if chunk is None:
        model(input_ids=torch.tensor([[*prompt_ids, *ids]], device=device))
        return time.perf_counter() - start
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([list(prompt_ids)], device=device), cache=cache, use_cache=True, logits_to_keep=1)
    for lo in range(0, len(ids), chunk):
        model(input_ids=torch.tensor([list(ids[lo : lo + chunk])], device=device), cache=cache, use_cache=True)
    return time.perf_counter() - start


def measure_replay_cost(
    loaded: LoadedModel,
    prompt: ChatPrompt,
    ids: Sequence[int],
    policy: str = "h2o",
    budget: int = 512,
    interval: int = 32,
    repeats: int = 3,
) -> ReplayCostResult:
    """Alternate the three contenders ``repeats`` times after a short warm-up; keep each one's best."""
    warm = list(ids[: 2 * interval])
    time_replay(loaded, prompt, warm, policy, budget, interval)
    time_plain_pass(loaded, prompt.ids, warm, None)
    time_plain_pass(loaded, prompt.ids, warm, interval)
    replay, one_pass, chunked = [], [], []
    for _ in range(repeats):
        replay.append(time_replay(loaded, prompt, ids, policy, budget, interval))
        one_pass.append(time_plain_pass(loaded, prompt.ids, ids, None))
        chunked.append(time_plain_pass(loaded, prompt.ids, ids, interval))
    return ReplayCostResult(len(ids), min(replay), min(one_pass), min(chunked))
