"""Frame pacing: at most one frame every ``interval`` seconds, whatever the token rate.

A fast model produces hundreds of steps per second and a slow one a step every second;
the browser wants a steady ≈5–10 frames per second either way.  Callers ask
:meth:`FramePacer.due` after each step and render a frame only when it says so, then
always render one final frame when the run ends.

A room of clients playing recordings at once shares the server's one interpreter: every stream
in :func:`streaming` counts, and while more than :data:`CROWD` stream, every pacer spaces its
frames by the crowd (twice as many streams, half the frames each), so the server's work stays
about what :data:`CROWD` streams cost and a newcomer's first frame, always due at once, is not
stuck behind everyone else's next one.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from collections.abc import Callable, Iterator

DEFAULT_FRAME_INTERVAL = 0.15  # seconds: ≈6.7 frames per second
FIGURE_INTERVAL = 5.0  # seconds between chart redraws while a run streams (each is a long main-thread task)
CROWD = 4  # streams drawn at the full frame rate; beyond, every stream's frames are spaced out

_streams = 0
_streams_lock = threading.Lock()


@contextmanager
def streaming() -> Iterator[None]:
    """Count a stream (a playback) while it runs."""
    global _streams
    with _streams_lock:
        _streams += 1
    try:
        yield
    finally:
        with _streams_lock:
            _streams -= 1


def crowd_spread() -> float:
    """How much further apart frames go now: 1 up to :data:`CROWD` streams, ``streams / CROWD`` beyond."""
    return max(1.0, _streams / CROWD)


class FramePacer:
    """Says when the next frame is due; the first call is due unless ``wait_first`` (then the
    first call starts the clock, and the first due one comes ``interval`` later).  While a crowd
    streams, the interval stretches by :func:`crowd_spread`."""

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
        if self._last is not None and now - self._last < self.interval * crowd_spread():
            return False
        self._last = now
        return True


def chart_pacer(clock: Callable[[], float] = time.monotonic) -> FramePacer:
    """When a streaming run redraws its charts: every :data:`FIGURE_INTERVAL` seconds, not at its
    start (a chart of no steps shows nothing new, and each redraw is a long task in the browser)."""
    return FramePacer(FIGURE_INTERVAL, clock, wait_first=True)
