"""Batched runs: Compare's columns and a sweep group as rows of one forward pass, against one pass each.

Everything runs in one process on one loaded model, the contenders alternating, best of
``repeats`` after a short warm-up, so machine noise hits every contender alike:

- *Compare, generate*: ``columns`` (the full cache among them) decode ``new_tokens`` each, batched
  and one pass per column, beside a single column alone (the ratio's denominator);
- *Compare, replay*: the same columns replay the trace with fidelity measured (the lockstep
  replay: the evicting columns and the full cache), batched and not, beside one column's replay;
- *sweep group*: the full cache and ``sweep_policies`` in lockstep over the trace, as
  :func:`thinkviz.sweep.grid.run_group` runs one group, batched and not, beside one policy's replay.

Peak memory is the process's resident set sampled while each contender runs (its highest reading
over the repeats).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..core.engine import DecodeSettings, Run
from ..measure.comparison import Column, Comparison
from ..measure.replay import LockstepReplay
from ..models.loading import LoadedModel
from ..policies import make_policy
from ..text.chat import ChatPrompt
from .served import PeakSampler

COLUMNS = ("full", "window", "h2o", "tova", "snapkv", "knorm")
SWEEP_POLICIES = (
    "window",
    "streaming",
    "h2o",
    "tova",
    "snapkv",
    "entropy",
    "tam",
    "rkv",
    "knorm",
    "keydiff",
    "pyramidkv",
    "adakv",
)


@dataclass
class Timing:
    """One contender: its best wall time, the tokens each of its runs advanced, its peak memory."""

    seconds: float = float("inf")
    tokens: int = 0
    peak_bytes: int = 0
    runs: int = 1

    def add(self, seconds: float, tokens: int, peak: int) -> None:
        self.seconds, self.tokens, self.peak_bytes = min(self.seconds, seconds), tokens, max(self.peak_bytes, peak)

    @property
    def tokens_per_second(self) -> float:
        """Tokens per second of each run (every run advances ``tokens`` in the contender's time)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class BatchResult:
    """``{scenario: {"one": Timing, "unbatched": Timing, "batched": Timing}}``."""

    scenarios: dict[str, dict[str, Timing]] = field(default_factory=dict)

    def ratio(self, scenario: str, contender: str = "batched") -> float:
        """The contender's wall time ÷ the single run's."""
        timings = self.scenarios[scenario]
        return timings[contender].seconds / timings["one"].seconds


def _timed(work: Callable[[], int]) -> tuple[float, int, int]:
    """Seconds, tokens per run and peak resident bytes of ``work()`` (which returns the tokens)."""
    with PeakSampler(os.getpid(), interval=0.05) as sampler:
        start = time.perf_counter()
        tokens = work()
        seconds = time.perf_counter() - start
    return seconds, tokens, sampler.peak


def _columns(names: Sequence[str], budget: int, interval: int) -> list[Column]:
    return [Column(make_policy(name, budget=budget, interval=interval)) for name in names]


def _compare(loaded, columns, prompt, trace, settings, batched: bool) -> Callable[[], int]:
    def work() -> int:
        comparison = Comparison(
            loaded, columns, prompt, trace, settings, measure=trace is not None, reference_run=False, batched=batched
        )
        for _ in comparison:
            pass
        return sum(len(event.token_ids) for event in comparison.runs[0].record.events)

    return work


def _group(loaded, names, prompt, trace, budget, interval, batched: bool) -> Callable[[], int]:
    def work() -> int:
        policies = [make_policy(name, budget=budget, interval=interval) for name in names]
        replay = LockstepReplay(loaded, policies, prompt, trace, DecodeSettings(), batched=batched).run()
        return replay.reference.processed - replay.prompt_tokens

    return work


def _alone(loaded, name, prompt, trace, budget, interval) -> Callable[[], int]:
    def work() -> int:
        run = Run(loaded, make_policy(name, budget=budget, interval=interval), prompt, DecodeSettings())
        for _ in run.replay(trace):
            pass
        return run.processed - len(prompt.ids)

    return work


def measure_batch(
    loaded: LoadedModel,
    prompt: ChatPrompt,
    trace: Sequence[int],
    columns: Sequence[str] = COLUMNS,
    sweep_policies: Sequence[str] = SWEEP_POLICIES,
    new_tokens: int = 256,
    budget: int = 256,
    interval: int = 32,
    repeats: int = 1,
    progress: Callable[[str], None] = lambda line: None,
) -> BatchResult:
    """Time the three scenarios (module docstring), alternating their contenders ``repeats`` times;
    ``progress`` gets a line after each contender."""
    settings = DecodeSettings(max_new_tokens=new_tokens, stop_at_eos=False, scoring=True)
    many, one = _columns(columns, budget, 1), _columns(columns[-1:], budget, 1)
    replaying, replaying_one = _columns(columns, budget, interval), _columns(columns[-1:], budget, interval)
    trace = list(trace)
    contenders = {
        "compare generate": {
            "one": _compare(loaded, one, prompt, None, settings, True),
            "unbatched": _compare(loaded, many, prompt, None, settings, False),
            "batched": _compare(loaded, many, prompt, None, settings, True),
        },
        "compare replay": {
            "one": _compare(loaded, replaying_one, prompt, trace, settings, True),
            "unbatched": _compare(loaded, replaying, prompt, trace, settings, False),
            "batched": _compare(loaded, replaying, prompt, trace, settings, True),
        },
        "sweep group": {
            "one": _alone(loaded, sweep_policies[0], prompt, trace, budget, interval),
            "unbatched": _group(loaded, sweep_policies, prompt, trace, budget, interval, False),
            "batched": _group(loaded, sweep_policies, prompt, trace, budget, interval, True),
        },
    }
    counts = {"compare generate": len(columns), "compare replay": len(columns), "sweep group": len(sweep_policies) + 1}
    _timed(_compare(loaded, one, prompt, trace[: 2 * interval], settings, True))  # warm-up
    result = BatchResult({name: {key: Timing() for key in work} for name, work in contenders.items()})
    for _ in range(repeats):
        for name, work in contenders.items():
            for key, contender in work.items():
                timing = result.scenarios[name][key]
                timing.add(*_timed(contender))
                timing.runs = 1 if key == "one" else counts[name]
                progress(f"{name}, {key}: {timing.seconds:.2f} s")
    return result


def report(result: BatchResult, columns: int, sweep_policies: int) -> list[str]:
    """The lines the bench command prints, ending with the two ratios (see the command's help)."""
    lines = []
    for name, timings in result.scenarios.items():
        for key in ("one", "unbatched", "batched"):
            timing = timings[key]
            lines.append(
                f"{name:<17} {key:<10} {timing.runs:>2} run(s): {timing.seconds:8.2f} s, "
                f"{timing.tokens_per_second:7.1f} tok/s per column, peak memory {timing.peak_bytes / 2**20:7.0f} MiB"
            )
        lines.append(
            f"{name}: one pass per run ÷ 1 run: {result.ratio(name, 'unbatched'):.2f}; "
            f"batched ÷ 1 run: {result.ratio(name):.2f}"
        )
    peak = lambda name: result.scenarios[name]["batched"].peak_bytes / 2**20  # noqa: E731
    lines.append(
        f"compare, {columns} columns batched ÷ 1 column: {result.ratio('compare generate'):.2f}"
        f"  (peak memory {peak('compare generate'):.0f} MiB; target <= 2)"
    )
    lines.append(
        f"sweep group, {sweep_policies} policies batched ÷ 1 replay: {result.ratio('sweep group'):.2f}"
        f"  (peak memory {peak('sweep group'):.0f} MiB; target <= 4)"
    )
    return lines
