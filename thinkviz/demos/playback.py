"""A preset recording played back as if it were running, with no model.

:class:`Playback` walks one of a :class:`~thinkviz.demos.recordings.Recording`'s timelines (the Live
tab's run or the Compare tab's) at ``speed`` times the recorded pace and, between steps, holds
what a :class:`~thinkviz.measure.comparison.Comparison` holds at the same moment: ``runs`` whose
``record`` has the events shown so far (the segments as they stood then, the summary only once the
run is over), ``reference``, ``fidelity`` measured so far, ``phase``, ``done`` and ``total``.  So the
app's frame generators draw a playback exactly as they draw a live run.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator

from ..core.events import RunRecord
from ..measure.metrics import TokenFidelity
from .recordings import LIVE_KEY, REFERENCE_KEY, Recording

SPEEDS = {"1×": 1.0, "2×": 2.0, "4×": 4.0, "8×": 8.0, "16×": 16.0, "as fast as it draws": math.inf}
DEFAULT_SPEED = "4×"


class PlayedRun:
    """One recorded run as it stood at a moment of the playback (its ``record`` grows as it plays)."""

    def __init__(self, recording: Recording, index: int) -> None:
        self.recording, self.index = recording, index
        full = self.full = recording.records[index]
        self.record = RunRecord(
            meta=full.meta,
            prompt_ids=full.prompt_ids,
            prompt_texts=full.prompt_texts,
            prompt_labels=full.prompt_labels,
            segments=recording.segments_at(index, 0),
        )

    def show(self, events: int) -> None:
        """Show the run after its first ``events`` events."""
        full, record = self.full, self.record
        if events == len(record.events):
            return
        record.events = full.events[:events]
        record.segments = self.recording.segments_at(self.index, events)
        last = record.events[-1].step if record.events else -1
        record.snapshots = {s: m for s, m in full.snapshots.items() if s <= last}
        record.summary = full.summary if events == len(full.events) else {}


class Playback:
    """``recording``'s ``view`` timeline (``"live"`` or ``"compare"``) played at ``speed`` × the recorded
    pace (``math.inf``: as fast as the frames are drawn); setting ``cancel`` stops it after a step."""

    def __init__(
        self,
        recording: Recording,
        view: str,
        speed: float = 1.0,
        cancel: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if view not in recording.timelines:
            raise ValueError(f"unknown view {view!r}; a recording has {', '.join(recording.timelines)}")
        if not speed > 0:
            raise ValueError(f"speed must be positive, got {speed}")
        self.recording, self.view, self.speed = recording, view, speed
        self.cancel = cancel or threading.Event()
        self.clock, self.sleep = clock, sleep
        self.steps = recording.timelines[view]
        self.replay = recording.mode == "replay"
        if view == "live":
            shown, self._keys = [recording.live], {0: LIVE_KEY, None: REFERENCE_KEY}
            live = recording.live
            own = recording.records[live].meta["policy"]
            self.labels = [recording.labels[live] if live < len(recording.labels) else own]
        else:
            shown = list(range(len(recording.labels)))
            self._keys = {**{i: str(i) for i in shown}, None: REFERENCE_KEY}
            self.labels = list(recording.labels)
        self.runs = [PlayedRun(recording, i) for i in shown]
        self.reference = PlayedRun(recording, recording.reference) if recording.reference is not None else None
        self.fidelity: dict[int | None, TokenFidelity] = {}
        self.phase, self.done = "prefill", 0
        self.total = self.steps[0].total if self.steps else 0
        self.stopped = False
        self.position = -1  # the step shown (-1: none yet)
        self._shown = shown

    @property
    def seconds(self) -> float:
        """How long the whole playback takes at its speed."""
        return 0.0 if not self.steps or math.isinf(self.speed) else self.steps[-1].seconds / self.speed

    def left(self) -> float:
        """Seconds of playback still to go."""
        if not self.steps or math.isinf(self.speed):
            return 0.0
        now = self.steps[self.position].seconds if self.position >= 0 else 0.0
        return max(0.0, self.steps[-1].seconds - now) / self.speed

    def __iter__(self) -> Iterator[Playback]:
        start = self.clock()
        for position, step in enumerate(self.steps):
            if self.cancel.is_set():
                self.stopped = True
                return
            if not math.isinf(self.speed):
                wait = start + step.seconds / self.speed - self.clock()
                if wait > 0:
                    self.sleep(wait)
            self.show(position)
            yield self

    def show(self, position: int) -> None:
        """Hold what the run held after the timeline's step ``position`` (0-based)."""
        step = self.steps[position]
        self.phase, self.done, self.total = step.phase, step.done, step.total
        for run, index in zip(self.runs, self._shown):
            run.show(step.events[index])
        if self.reference is not None:
            self.reference.show(step.events[self.recording.reference])
        self.fidelity = {
            column: self.recording.fidelity[key].first(step.fidelity[key])
            for column, key in self._keys.items()
            if key in step.fidelity
        }
        self.position = position

    def at(self, position: int) -> Playback:
        """A still of this playback's recording and view, holding what the run held after step ``position``."""
        still = Playback(self.recording, self.view, math.inf)
        still.show(position)
        return still
