"""Engine overhead: ThinkViz's evicting, scoring decode loop vs plain ``model.generate``.

Both decode the same number of tokens greedily from the same prompt on the same loaded
model, in the same process, alternating, so machine noise hits both alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..chat import REASONING_SYSTEM_PROMPT, build_chat
from ..engine import DecodeSettings, Run
from ..model import LoadedModel
from ..policies import make_policy

PROMPT = "Explain step by step why the sum of two odd numbers is always even."


@dataclass
class OverheadResult:
    new_tokens: int
    engine_tokens_per_second: float
    generate_tokens_per_second: float

    @property
    def ratio(self) -> float:
        """Engine throughput ÷ ``model.generate`` throughput (target ≥ 0.85)."""
        return self.engine_tokens_per_second / self.generate_tokens_per_second


def time_engine(loaded: LoadedModel, new_tokens: int, budget: int, policy: str = "h2o", scoring: bool = True) -> float:
    """Tokens per second of a full engine run (prefill included), nothing stops it early.

    ``scoring=False`` leaves out the per-step importance scores (a policy that evicts still
    captures the attention it needs)."""
    prompt = build_chat(loaded.tokenizer, REASONING_SYSTEM_PROMPT, PROMPT)
    settings = DecodeSettings(max_new_tokens=new_tokens, stop_at_eos=False, scoring=scoring)
    run = Run(loaded, make_policy(policy, budget=budget, interval=1), prompt, settings)
    start = time.perf_counter()
    produced = sum(len(event.token_ids) for event in run.generate())
    return produced / (time.perf_counter() - start)


def time_generate(loaded: LoadedModel, new_tokens: int) -> float:
    """Tokens per second of ``model.generate`` (greedy, EOS ignored) on the same prompt."""
    prompt = build_chat(loaded.tokenizer, REASONING_SYSTEM_PROMPT, PROMPT)
    ids = torch.tensor([prompt.ids], device=loaded.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = loaded.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=loaded.tokenizer.eos_token_id,
        )
    return (out.shape[1] - ids.shape[1]) / (time.perf_counter() - start)


def measure_overhead(loaded: LoadedModel, new_tokens: int = 512, budget: int = 128, repeats: int = 2) -> OverheadResult:
    """Alternate engine and baseline ``repeats`` times after a warm-up; keep each one's best."""
    time_engine(loaded, 8, budget)
    time_generate(loaded, 8)
    engine, baseline = [], []
    for _ in range(repeats):
        engine.append(time_engine(loaded, new_tokens, budget))
        baseline.append(time_generate(loaded, new_tokens))
    return OverheadResult(new_tokens, max(engine), max(baseline))
