"""How long a run will take on this machine: the work it plans, the speed measured here, an estimate.

A run's time is its forward passes.  A :class:`Phase` says what one phase of a request does:
``runs`` runs driven together (Compare's columns, a policy and its full-cache reference in
lockstep), each prefilling ``prompt_tokens`` in chunks and then taking ``steps`` forward passes
of ``rows`` tokens each (one token per step when generating, ``interval`` tokens per chunk in a
replay).  :class:`Speed` prices one forward of ``q`` tokens after ``t`` cached ones as
``base + q · (per_token + per_context · t)`` seconds of wall-clock time: it is measured on the
loaded model by :func:`measure_speed` (a short calibration right after loading), and corrected
after every real run by :meth:`Speed.learn` (the ratio of measured to estimated time, which
takes in what the calibration does not see: the policy, scoring, building the frames).

While a run streams, :class:`Progress` says how much is left: from the run's own pace once it has
done some steps (what is left of the phase at the pace of its last steps, later phases priced by
:class:`Speed` and slowed as much), from :class:`Speed` alone before that.  Every function takes a ``clock``, so tests
drive it with a fake one.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core.engine import DecodeSettings, Run
from ..core.events import StepEvent
from ..models.loading import LoadedModel
from ..policies import REFERENCE_POLICY, make_policy

Clock = Callable[[], float]

CALIBRATION_PROMPT = 96  # tokens prefilled by each calibration run
CALIBRATION_CHUNK = 32  # rows of the replayed chunks it times
CALIBRATION_CHUNKS = 3
CALIBRATION_STEPS = 4  # decode steps it times
LEARN_WEIGHT = 0.5  # how far one run's measured/estimated ratio moves the correction
CORRECTION_RANGE = (0.25, 8.0)
RECENT_STEPS = 16  # a run is paced over its last steps: a served app's load comes and goes within a run


@dataclass(frozen=True)
class Phase:
    """One phase of a request: ``runs`` runs together, each prefilling ``prompt_tokens`` (in chunks of
    ``prefill_chunk``), then ``steps`` forwards of ``rows`` tokens (the last one may be shorter:
    ``tokens`` is the total after the prompt)."""

    label: str
    runs: int
    prompt_tokens: int
    tokens: int  # tokens after the prompt: the trace's, or the most a generation may produce
    rows: int = 1  # tokens per forward after the prompt
    prefill_chunk: int = 256

    @property
    def steps(self) -> int:
        return math.ceil(self.tokens / self.rows) if self.tokens > 0 else 0


@dataclass
class Speed:
    """Seconds per forward pass on this machine: ``base + q · (per_token + per_context · t)`` for ``q`` new
    tokens after ``t`` cached ones, times ``correction`` (learnt from real runs)."""

    base: float
    per_token: float
    per_context: float = 0.0
    correction: float = 1.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def forward(self, q: int, cached: int) -> float:
        """Seconds of one forward of ``q`` tokens after ``cached`` ones (before the correction)."""
        return self.base + q * (self.per_token + self.per_context * cached)

    def phase_seconds(self, phase: Phase, done_steps: int = 0) -> float:
        """Seconds ``phase`` takes (from step ``done_steps`` on, prefill included only at 0), corrected."""
        seconds = 0.0
        if done_steps == 0:
            for start in range(0, phase.prompt_tokens, phase.prefill_chunk):
                seconds += self.forward(min(phase.prefill_chunk, phase.prompt_tokens - start), start)
        for step in range(done_steps, phase.steps):
            cached = phase.prompt_tokens + step * phase.rows
            seconds += self.forward(min(phase.rows, phase.tokens - step * phase.rows), cached)
        return seconds * phase.runs * self.correction

    def estimate(self, phases: Sequence[Phase]) -> float:
        """Seconds the whole request takes."""
        return sum(self.phase_seconds(phase) for phase in phases)

    def learn(self, phases: Sequence[Phase], seconds: float) -> None:
        """Fold a finished request's measured ``seconds`` into the correction (a run cut short by
        Stop or end-of-text is not a measurement of its plan: do not pass it)."""
        planned = self.estimate(phases) / self.correction
        if planned <= 0 or seconds <= 0:
            return
        low, high = CORRECTION_RANGE
        with self._lock:
            ratio = (seconds / planned) / self.correction
            self.correction = min(high, max(low, self.correction * ratio**LEARN_WEIGHT))

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, int, float]]) -> Speed:
        """The speed that best explains ``samples`` of ``(q, cached, seconds)`` (least squares over
        ``base``, ``per_token`` and, when the samples vary in context, ``per_context``; none negative).
        The residuals are relative (each sample weighs ``1 / seconds``): a decode step of one token
        takes a twentieth of a replayed chunk, and absolute residuals would let the chunks decide alone,
        pricing a generation at a fifth of its time (measured: 1.3 s estimated, 6.4 s taken)."""
        q = np.array([s[0] for s in samples], dtype=np.float64)
        t = np.array([s[1] for s in samples], dtype=np.float64)
        y = np.array([s[2] for s in samples], dtype=np.float64)
        columns = [np.ones_like(q), q] + ([q * t] if len(set(t.tolist())) > 2 else [])
        weight = 1.0 / np.maximum(y, 1e-9)
        solution, *_ = np.linalg.lstsq(np.stack(columns, axis=1) * weight[:, None], y * weight, rcond=None)
        solution = np.maximum(solution, 0.0)
        if solution[0] == 0 and solution[1] == 0:
            solution[1] = max(float(y.sum() / q.sum()), 1e-6)
        return cls(float(solution[0]), float(solution[1]), float(solution[2]) if len(solution) > 2 else 0.0)


def format_seconds(seconds: float) -> str:
    """``"about 40 s"``, ``"about 2 min 10 s"``, ``"under 5 s"``: a duration as people say it."""
    if seconds < 5:
        return "under 5 s"
    if seconds < 60:
        return f"about {int(round(seconds / 5) * 5)} s"
    minutes, rest = divmod(int(round(seconds / 10) * 10), 60)
    if minutes >= 10:
        return f"about {int(round(seconds / 60))} min"
    return f"about {minutes} min" + (f" {rest} s" if rest else "")


class Progress:
    """How much of a request is left while it runs: call :meth:`step` with the tokens the current phase
    has done (and :meth:`next_phase` between phases), then read :meth:`left`."""

    def __init__(self, speed: Speed, phases: Sequence[Phase], clock: Clock = time.monotonic) -> None:
        if not phases:
            raise ValueError("a request has at least one phase")
        self.speed, self.phases, self.clock = speed, list(phases), clock
        self.started = self._phase_started = clock()
        self.phase, self.done = 0, 0
        self._recent: deque[tuple[float, int]] = deque(maxlen=RECENT_STEPS + 1)  # (time, tokens done) per step

    def step(self, done: int | None = None) -> None:
        """The current phase has done ``done`` tokens (default: one step's more)."""
        self.done = self.done + self.phases[self.phase].rows if done is None else done
        self._recent.append((self.clock(), self.done))  # paced from the first step on: the prefill is behind

    def next_phase(self) -> None:
        self.phase = min(self.phase + 1, len(self.phases) - 1)
        self.done, self._phase_started = 0, self.clock()
        self._recent.clear()

    def _pace(self) -> tuple[float, float] | None:
        """Over this phase's last steps (:data:`RECENT_STEPS`): seconds per token, and that time over its
        priced time (2.0: twice as slow as priced); ``None`` before a second step."""
        if len(self._recent) < 2 or self.done <= self._recent[0][1]:
            return None
        phase, (start, first) = self.phases[self.phase], self._recent[0]
        seconds = self.clock() - start
        steps = [-(-tokens // phase.rows) for tokens in (first, self.done)]  # steps done, the last partial
        planned = self.speed.phase_seconds(phase, steps[0]) - self.speed.phase_seconds(phase, steps[1])
        return seconds / (self.done - first), (seconds / planned if planned > 0 else 1.0)

    def slowdown(self) -> float | None:
        """How much slower than priced this phase's last steps ran (as on a server busy with other work
        that comes and goes); ``None`` before it has a pace."""
        pace = self._pace()
        return None if pace is None else pace[1]

    def left(self) -> float:
        """Seconds still to go: the rest of this phase at its recent pace, then the later phases as priced,
        slowed as this one is now (before it has a pace: all as priced)."""
        phase = self.phases[self.phase]
        later = sum(self.speed.phase_seconds(p) for p in self.phases[self.phase + 1 :])
        pace = self._pace()
        if pace is not None:
            seconds_per_token, slowdown = pace
            return max(0.0, (phase.tokens - self.done) * seconds_per_token) + later * slowdown
        planned = self.speed.phase_seconds(phase)
        return max(0.0, planned - (self.clock() - self._phase_started)) + later

    def elapsed(self) -> float:
        return self.clock() - self.started

    def text(self) -> str:
        """``"about 40 s left"`` for a status line."""
        return f"{format_seconds(self.left())} left"


def measure_speed(loaded: LoadedModel, clock: Clock = time.perf_counter) -> Speed:
    """Time a few forwards of ``loaded`` through the engine as a run does them (a full-cache run with
    scoring on): the prefill of a short prompt, ``CALIBRATION_CHUNKS`` replayed chunks and
    ``CALIBRATION_STEPS`` decode steps, at two context lengths; fit :class:`Speed` to them."""
    samples: list[tuple[int, int, float]] = []
    vocab = max(2, int(getattr(loaded.tokenizer, "vocab_size", 1000)) - 1)
    for prompt_tokens in (CALIBRATION_PROMPT, 4 * CALIBRATION_PROMPT):
        prompt_tokens = min(prompt_tokens, loaded.geometry.max_context // 4)
        ids = [(7 * i + 11) % vocab + 1 for i in range(prompt_tokens)]
        settings = DecodeSettings(max_new_tokens=CALIBRATION_STEPS, stop_at_eos=False)
        chunked = Run(loaded, make_policy(REFERENCE_POLICY, interval=CALIBRATION_CHUNK), ids, settings)
        trace = [(5 * i + 3) % vocab + 1 for i in range(CALIBRATION_CHUNK * CALIBRATION_CHUNKS)]
        samples += _timed(chunked.replay(trace), prompt_tokens, CALIBRATION_CHUNK, clock)
        stepped = Run(loaded, make_policy(REFERENCE_POLICY, interval=1), ids, settings)
        samples += _timed(stepped.generate(), prompt_tokens, 1, clock)
    return Speed.fit(samples)


def _timed(events: Iterator[StepEvent], prompt_tokens: int, rows: int, clock: Clock) -> list[tuple[int, int, float]]:
    """``(rows, cached, seconds)`` of each step of ``events``; the first one, which also prefilled the
    prompt, counts as one forward of the prompt and its rows together."""
    out, last, cached = [], clock(), prompt_tokens
    for index, _ in enumerate(events):
        now = clock()
        out.append((prompt_tokens + rows, 0, now - last) if index == 0 else (rows, cached, now - last))
        cached += rows
        last = now
    return out
