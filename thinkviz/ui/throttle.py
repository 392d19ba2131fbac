"""Frame pacing: at most one frame every ``interval`` seconds, whatever the token rate.

A fast model produces hundreds of steps per second and a slow one a step every second;
the browser wants a steady ≈5–10 frames per second either way.  Callers ask
:meth:`FramePacer.due` after each step and render a frame only when it says so, then
always render one final frame when the run ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_FRAME_INTERVAL = 0.15  # seconds: ≈6.7 frames per second
FIGURE_INTERVAL = 5.0  # seconds between chart redraws while a run streams (each is a long main-thread task)


class FramePacer:
    """Says when the next frame is due; the first call is due unless ``wait_first`` (then the
    first call starts the clock, and the first due one comes ``interval`` later)."""

    def __init__(
        self,
        interval: float = DEFAULT_FRAME_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        *,
        wait_first: bool = False,
    ) -> None:
        if interval < 0:
            raise ValueError(f"interval must be ≥ 0, got {interval}")
        self.interval = interval
        self._clock = clock
        self._last: float | None = None
        self._wait_first = wait_first

    def due(self) -> bool:
        """True (and the clock restarts) when ``interval`` has passed since the last due frame."""
        now = self._clock()
        if self._last is None and self._wait_first:
            self._last = now
            return False
        if self._last is not None and now - self._last < self.interval:
            return False
        self._last = now
        return True


def chart_pacer(clock: Callable[[], float] = time.monotonic) -> FramePacer:
    """When a streaming run redraws its charts: every :data:`FIGURE_INTERVAL` seconds, not at its
    start (a chart of no steps shows nothing new, and each redraw is a long task in the browser)."""
    return FramePacer(FIGURE_INTERVAL, clock, wait_first=True)
