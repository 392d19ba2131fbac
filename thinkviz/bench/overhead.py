"""Engine overhead: ThinkViz's evicting, scoring decode loop vs plain ``model.generate``.

Both decode the same number of tokens greedily from the same prompt on the same loaded
model, in the same process, alternating, so machine noise hits both alike, and with the same
attention kernel: eager when the engine needs the attention weights, SDPA when it runs an
attention-free policy without scores (so the ratio is the engine's own cost).  Each run is timed
by the wall clock and by the process's CPU time: on a machine shared with other jobs a wall
second includes waits for a busy core, which land on either contender by chance; the CPU-time
ratio leaves them out (both contenders run on one thread with ``OMP_NUM_THREADS=1``).
With a quantized KV format the engine also runs with its cache in that format, in the same
alternation, and the quantized engine's throughput is compared with the full-precision engine's.

At long context (:func:`measure_context_overhead`) the prompt is ``L`` tokens of the shipped
traces, and only the decode steps after the first generated token are timed (the prefill is
reported apart): the engine holds ``budget`` slots per head while ``generate`` attends to the
whole ``L``-token cache with the model's fast attention (SDPA), which is where eviction
should pay off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from collections.abc import Sequence

import torch
from transformers import StoppingCriteria

from ..core.attention import attention_implementation
from ..text.chat import REASONING_SYSTEM_PROMPT, build_chat
from ..core.engine import DecodeSettings, Run, attention_kernel
from ..core.kvquant import KVQuant
from ..models.loading import LoadedModel
from ..policies import make_policy
from ..demos.presets import PRESETS_DIR

PROMPT = "Explain step by step why the sum of two odd numbers is always even."


@dataclass
class Throughput:
    """Tokens per second of one timed run: per wall-clock second, and per second of this process's
    CPU time (on a shared machine the second counts only the time the run was scheduled)."""

    wall: float
    cpu: float


@dataclass
class OverheadResult:
    new_tokens: int
    engine_tokens_per_second: float
    generate_tokens_per_second: float
    attention: str = "eager"  # the kernel both ran with
    engine_cpu_tokens_per_second: float = 0.0
    generate_cpu_tokens_per_second: float = 0.0
    quantized_tokens_per_second: float | None = None  # the engine with its cache in ``kv_quant``

    @property
    def ratio(self) -> float:
        """Engine throughput ÷ ``model.generate`` throughput (target ≥ 0.85)."""
        return self.engine_tokens_per_second / self.generate_tokens_per_second

    @property
    def kv_quant_ratio(self) -> float | None:
        """Quantized-cache engine ÷ full-precision engine throughput (target ≥ 0.7 on the CPU)."""
        if self.quantized_tokens_per_second is None:
            return None
        return self.quantized_tokens_per_second / self.engine_tokens_per_second

    @property
    def cpu_ratio(self) -> float:
        """The same per CPU second: the waits for a core that other jobs hold count for neither."""
        return self.engine_cpu_tokens_per_second / self.generate_cpu_tokens_per_second


class _Timer:
    """Wall-clock and process CPU time of a block; :meth:`rate` turns a token count into a :class:`Throughput`."""

    def __enter__(self) -> _Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def rate(self, tokens: int) -> Throughput:
        return Throughput(tokens / self.wall, tokens / max(self.cpu, 1e-9))


def time_engine(
    loaded: LoadedModel,
    new_tokens: int,
    budget: int,
    policy: str = "h2o",
    scoring: bool = True,
    interval: int = 1,
    kv_quant: KVQuant = KVQuant(),
) -> Throughput:
    """Tokens per second of a full engine run (prefill included), nothing stops it early.

    ``scoring=False`` leaves out the per-step importance scores (a policy that evicts still
    captures the attention it needs); ``kv_quant`` is the cache's storage format."""
    prompt = build_chat(loaded.tokenizer, REASONING_SYSTEM_PROMPT, PROMPT)
    settings = DecodeSettings(max_new_tokens=new_tokens, stop_at_eos=False, scoring=scoring)
    run = Run(loaded, make_policy(policy, budget=budget, interval=interval), prompt, settings, kv_quant=kv_quant)
    with _Timer() as timer:
        produced = sum(len(event.token_ids) for event in run.generate())
    return timer.rate(produced)


def time_generate(loaded: LoadedModel, new_tokens: int, attention: str = "eager") -> Throughput:
    """Tokens per second of ``model.generate`` (greedy, EOS ignored) on the same prompt, with the
    ``attention`` kernel."""
    prompt = build_chat(loaded.tokenizer, REASONING_SYSTEM_PROMPT, PROMPT)
    ids = torch.tensor([prompt.ids], device=loaded.device)
    with _Timer() as timer, attention_implementation(loaded.model, attention):
        out = _greedy(loaded, ids, new_tokens)
    return timer.rate(out.shape[1] - ids.shape[1])


@torch.inference_mode()
def _greedy(loaded: LoadedModel, ids: torch.Tensor, new_tokens: int, **options) -> torch.Tensor:
    """``model.generate``: exactly ``new_tokens`` greedy tokens after ``ids`` ``(1, n)``, EOS ignored."""
    return loaded.model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=loaded.tokenizer.eos_token_id,
        **options,
    )


def measure_overhead(
    loaded: LoadedModel,
    new_tokens: int = 512,
    budget: int = 128,
    repeats: int = 2,
    interval: int = 1,
    policy: str = "h2o",
    scoring: bool = True,
    kv_quant: KVQuant = KVQuant(),
) -> OverheadResult:
    """Alternate engine (``policy`` at ``budget``, per-token scores shown or not) and baseline
    ``repeats`` times after a warm-up (and, for a quantized ``kv_quant``, the engine in that format);
    keep each one's best (wall clock and CPU time apart)."""
    attention = attention_kernel(loaded.model, make_policy(policy, budget=budget), DecodeSettings(scoring=scoring))
    quantized = kv_quant.spec.quantized
    time_engine(loaded, 8, budget, policy, scoring, interval)
    time_generate(loaded, 8, attention)
    if quantized:
        time_engine(loaded, 8, budget, policy, scoring, interval, kv_quant)
    engine, baseline, in_format = [], [], []
    for _ in range(repeats):
        engine.append(time_engine(loaded, new_tokens, budget, policy, scoring, interval))
        baseline.append(time_generate(loaded, new_tokens, attention))
        if quantized:
            in_format.append(time_engine(loaded, new_tokens, budget, policy, scoring, interval, kv_quant))
    return OverheadResult(
        new_tokens,
        max(e.wall for e in engine),
        max(b.wall for b in baseline),
        attention,
        max(e.cpu for e in engine),
        max(b.cpu for b in baseline),
        max(q.wall for q in in_format) if quantized else None,
    )


@dataclass
class ContextResult:
    context: int
    new_tokens: int
    engine_prefill_seconds: float
    generate_prefill_seconds: float
    engine_tokens_per_second: float  # decode steps after the first generated token
    generate_tokens_per_second: float

    @property
    def ratio(self) -> float:
        """Engine decode tok/s ÷ ``generate`` decode tok/s at this context (target ≥ 1.3 at 8k)."""
        return self.engine_tokens_per_second / self.generate_tokens_per_second


def long_prompt(tokenizer, length: int) -> list[int]:
    """The first ``length`` tokens of the shipped traces, one after another (no chat template)."""
    texts = [path.read_text(encoding="utf-8") for path in sorted((PRESETS_DIR / "traces").glob("*.md"))]
    ids = tokenizer("\n\n".join(texts), add_special_tokens=False)["input_ids"]
    if len(ids) < length:
        raise ValueError(f"the shipped traces hold {len(ids)} tokens, fewer than {length}")
    return list(ids[:length])


class _FirstToken(StoppingCriteria):
    """Records when ``generate`` has produced its first token (prefill done); never stops it."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, input_ids, scores, **kwargs):
        if self.at is None:
            self.at = time.perf_counter()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def time_engine_context(
    loaded: LoadedModel, prompt: Sequence[int], new_tokens: int, budget: int, interval: int = 1, policy: str = "h2o"
) -> tuple[float, float]:
    """``(prefill seconds, decode tok/s after the first token)`` of an engine run on ``prompt``."""
    settings = DecodeSettings(max_new_tokens=new_tokens, stop_at_eos=False, scoring=True)
    run = Run(loaded, make_policy(policy, budget=budget, interval=interval), list(prompt), settings)
    start = time.perf_counter()
    events = run.generate()
    next(events)
    first = time.perf_counter()
    produced = sum(len(event.token_ids) for event in events)
    return first - start, produced / (time.perf_counter() - first)


def time_generate_context(loaded: LoadedModel, prompt: Sequence[int], new_tokens: int) -> tuple[float, float]:
    """``(prefill seconds, decode tok/s after the first token)`` of ``model.generate`` with SDPA attention."""
    ids = torch.tensor([list(prompt)], device=loaded.device)
    first = _FirstToken()
    with attention_implementation(loaded.model, "sdpa"):
        start = time.perf_counter()
        out = _greedy(loaded, ids, new_tokens, stopping_criteria=[first])
        end = time.perf_counter()
    return first.at - start, (out.shape[1] - ids.shape[1] - 1) / (end - first.at)


def measure_context_overhead(
    loaded: LoadedModel,
    contexts: Sequence[int],
    new_tokens: int = 128,
    budget: int = 512,
    interval: int = 1,
    repeats: int = 1,
) -> list[ContextResult]:
    """For each context length: engine and ``generate`` alternating ``repeats`` times, best of each."""
    longest = long_prompt(loaded.tokenizer, max(contexts))
    time_engine_context(loaded, longest[:64], 4, budget, interval)
    time_generate_context(loaded, longest[:64], 4)
    results = []
    for context in contexts:
        prompt = longest[:context]
        engine, baseline = [], []
        for _ in range(repeats):
            engine.append(time_engine_context(loaded, prompt, new_tokens, budget, interval))
            baseline.append(time_generate_context(loaded, prompt, new_tokens))
        results.append(
            ContextResult(
                context,
                new_tokens,
                min(e[0] for e in engine),
                min(b[0] for b in baseline),
                max(e[1] for e in engine),
                max(b[1] for b in baseline),
            )
        )
    return results
