"""Where a decode step's time goes: one engine run, timed part by part.

Two passes over the same decode run (prefill excluded: only steps after the first count):

1. *Spans*: every part of a step is wrapped in a timer that knows what runs inside it, so each
   part's time is its own (exclusive) time — the linears of an attention module are counted
   as linears, not as attention.  A perf_counter pair costs well under a microsecond, so the
   step time stays close to an unprofiled one (both are printed).
2. *Operators*: the same run under ``torch.profiler``, for the aten operators that use the
   most CPU time (the profiler's own per-operator cost inflates small operators here).

The parts are found from outside, without changing the engine or the model: forward
pre-/post-hooks on the model's modules, and wrappers around the run's policy, cache and
attention-capture methods (instance attributes, so nothing outside this run is touched).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from collections.abc import Callable

import torch
from torch import nn

from ..text.chat import REASONING_SYSTEM_PROMPT, build_chat
from ..core.engine import DecodeSettings, Run
from ..models.loading import LoadedModel
from ..policies import make_policy
from .overhead import PROMPT

LINEARS = "linear layers (q k v o gate up down)"
HEAD = "output head (logits)"
ATTENTION = "attention core (QK^T, softmax, ·V, rotary, KV append)"
LAYER_REST = "norms, MLP activation, residuals"
MODEL_GLUE = "model glue (embedding, mask/rotary setup, decoder loop)"
HOOKS = "attention hooks: score reductions"
ABSORB = "engine: fold scores into slot statistics"
POLICY = "policy: select (compress)"
SCORES = "policy: scores (for display, and inside select)"
GATHER = "cache gather (keep)"
BOOKKEEPING = "engine bookkeeping (view, holders, snapshots, eviction)"
ENGINE_FORWARD = "engine forward glue (inputs, positions, lock, hooks on/off)"
REST = "Python rest (sampling, token text, segments, event)"


class Spans:
    """Exclusive wall-clock time per named part, from nested enter/exit pairs."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list] = []  # [name, start, seconds of nested parts]

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def enter(self, name: str) -> None:
        self._stack.append([name, time.perf_counter(), 0.0])

    def exit(self) -> None:
        name, start, nested = self._stack.pop()
        elapsed = time.perf_counter() - start
        self.seconds[name] += elapsed - nested
        self.calls[name] += 1
        if self._stack:
            self._stack[-1][2] += elapsed

    def wrap(self, fn: Callable, name: str) -> Callable:
        def timed(*args, **kwargs):
            self.enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.exit()

        return timed

    def time_module(self, module: nn.Module, name: str) -> list:
        """Time ``module``'s forward as ``name``; returns the hook handles."""
        return [
            module.register_forward_pre_hook(lambda m, a: self.enter(name)),
            module.register_forward_hook(lambda m, a, o: self.exit()),
        ]


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or type(module).__name__ in ("Int4Linear", "Int8Linear")


def instrument_model(model: nn.Module, spans: Spans) -> list:
    """Hooks that time the model's parts; remove the returned handles afterwards."""
    handles = spans.time_module(model, MODEL_GLUE)
    for layer in model.model.layers:
        handles += spans.time_module(layer, LAYER_REST)
        handles += spans.time_module(layer.self_attn, ATTENTION)
        for module in layer.modules():
            if _is_linear(module):
                handles += spans.time_module(module, LINEARS)
    handles += spans.time_module(model.get_output_embeddings(), HEAD)
    return handles


def instrument_run(run: Run, spans: Spans) -> None:
    """Wrap this run's parts (instance attributes only)."""
    run.capture._on_attention = spans.wrap(run.capture._on_attention, HOOKS)
    run.capture._keep_hidden = spans.wrap(run.capture._keep_hidden, HOOKS)
    run._forward = spans.wrap(run._forward, ENGINE_FORWARD)
    run._absorb = spans.wrap(run._absorb, ABSORB)
    run._maybe_compress = spans.wrap(run._maybe_compress, BOOKKEEPING)
    run._view = spans.wrap(run._view, BOOKKEEPING)
    run._holders = spans.wrap(run._holders, BOOKKEEPING)
    run._maybe_snapshot = spans.wrap(run._maybe_snapshot, BOOKKEEPING)
    run._position_scores = spans.wrap(run._position_scores, BOOKKEEPING)
    run.policy.compress = spans.wrap(run.policy.compress, POLICY)
    run.policy.score = spans.wrap(run.policy.score, SCORES)
    run.cache.keep = spans.wrap(run.cache.keep, GATHER)


@dataclass
class Profile:
    steps: int
    step_seconds: float  # mean wall time of one instrumented step
    plain_step_seconds: float  # the same run without instrumentation
    parts: list[tuple[str, float, float]]  # (part, seconds per step, calls per step), largest first
    operators: list[tuple[str, float, float]]  # (aten operator, self CPU seconds per step, calls per step)
    attention: str = "eager"  # the attention kernel the run used


def _new_run(loaded: LoadedModel, policy: str, budget: int, interval: int, new_tokens: int, scoring: bool) -> Run:
    prompt = build_chat(loaded.tokenizer, REASONING_SYSTEM_PROMPT, PROMPT)
    settings = DecodeSettings(max_new_tokens=new_tokens + 1, stop_at_eos=False, scoring=scoring)
    return Run(loaded, make_policy(policy, budget=budget, interval=interval), prompt, settings)


def _decode_seconds(run: Run, on_first: Callable[[], None] = lambda: None) -> float:
    """Seconds for every step after the first (the first includes the prefill)."""
    events = run.generate()
    next(events)
    on_first()
    start = time.perf_counter()
    for _ in events:
        pass
    return time.perf_counter() - start


def profile_decode(
    loaded: LoadedModel,
    policy: str = "h2o",
    budget: int = 128,
    interval: int = 1,
    new_tokens: int = 64,
    top_ops: int = 12,
    scoring: bool = True,
) -> Profile:
    """Profile ``new_tokens`` decode steps of the engine (after a short warm-up run); ``scoring=False``
    leaves out the per-token scores the views show, as a sweep does."""
    _decode_seconds(_new_run(loaded, policy, budget, interval, 4, scoring))
    plain = _decode_seconds(_new_run(loaded, policy, budget, interval, new_tokens, scoring)) / new_tokens

    spans = Spans()
    run = _new_run(loaded, policy, budget, interval, new_tokens, scoring)
    instrument_run(run, spans)
    handles = instrument_model(loaded.model, spans)
    try:
        total = _decode_seconds(run, spans.reset)
    finally:
        for handle in handles:
            handle.remove()
    parts = {name: seconds for name, seconds in spans.seconds.items()}
    parts[REST] = total - sum(parts.values())
    calls = dict(spans.calls)
    ranked = sorted(parts.items(), key=lambda item: -item[1])

    run = _new_run(loaded, policy, budget, interval, new_tokens, scoring)
    events = run.generate()
    next(events)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in events:
            pass
    averages = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top_ops]
    operators = [(e.key, e.self_cpu_time_total / 1e6 / new_tokens, e.count / new_tokens) for e in averages]
    return Profile(
        steps=new_tokens,
        step_seconds=total / new_tokens,
        plain_step_seconds=plain,
        parts=[(name, seconds / new_tokens, calls.get(name, 0) / new_tokens) for name, seconds in ranked],
        operators=operators,
        attention=run.attention,
    )
