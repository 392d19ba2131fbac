"""What the status line says about time: how long a request will take before it starts, how much is
left while it runs, how long it took once done.

A live run is priced by the machine's measured :class:`~thinkviz.measure.estimate.Speed` and then by its own
pace (:class:`~thinkviz.measure.estimate.Progress`); once it ends normally its time corrects the speed for
the next estimate.  A playback knows its own length: the recorded time over the chosen speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..measure.comparison import Comparison
from ..measure.estimate import Progress, Speed, format_seconds
from ..demos.playback import Playback
from .room import report_progress

Clock = Callable[[], float]


class RunTimer:
    """The time of one request (a :class:`~thinkviz.measure.comparison.Comparison` or a
    :class:`~thinkviz.demos.playback.Playback`): call :meth:`update` after each of its steps."""

    def __init__(self, driver: Comparison | Playback, speed: Speed | None, clock: Clock = time.monotonic) -> None:
        self.driver, self.speed, self.clock = driver, speed, clock
        self.started = clock()
        self.progress = None
        if isinstance(driver, Comparison) and speed is not None:
            self.progress = Progress(speed, driver.plan(), clock)
        self._phase = None

    @property
    def playing(self) -> bool:
        return isinstance(self.driver, Playback)

    def update(self) -> None:
        if self.progress is None or self.driver.phase == "prefill":
            return
        if self._phase is not None and self.driver.phase != self._phase:
            self.progress.next_phase()
        self._phase = self.driver.phase
        self.progress.step(self.driver.done)
        report_progress(self.progress.left(), self.progress.slowdown())  # the model's line prices the run by it

    def total(self) -> str:
        """Before it starts: ``"about 2 min in all"`` (``""`` when there is nothing to go by)."""
        if self.playing:
            return f"{format_seconds(self.driver.seconds)} in all" if self.driver.seconds else ""
        if self.progress is None:
            return ""
        bound = "at most " if not self.driver.replay else ""
        return f"{bound}{format_seconds(self.progress.left())} in all on this machine"

    def left(self) -> str:
        """While it runs: ``"about 40 s left"`` (a generation may end sooner, at end of text)."""
        if self.playing:
            return f"{format_seconds(self.driver.left())} left"
        if self.progress is None:
            return ""
        bound = "at most " if self.driver.phase == "generate" else ""
        return f"{bound}{format_seconds(self.progress.left())} left"

    def elapsed(self) -> str:
        seconds = self.clock() - self.started
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"

    def finish(self) -> None:
        """The request ended: unless it was stopped, fold its time into the machine's speed."""
        driver = self.driver
        if self.playing or self.speed is None or driver.cancel.is_set():
            return
        self.speed.learn(driver.plan(finished=True), self.clock() - self.started)


def with_time(line: str, extra: str) -> str:
    """``line · extra`` (just ``line`` without an extra)."""
    return f"{line} · {extra}" if extra else line
