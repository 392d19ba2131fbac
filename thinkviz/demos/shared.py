"""Values built once however many threads ask for them at once: a room's clients asking for the same
decoded recording, or the same chart of it, wait for one build instead of each building it (a build
holds the one interpreter: thirty of them in a row put the last client seconds behind)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class SharedBuilds(Generic[T]):
    """Values built once per key, the ``kept`` most recently used kept; thread-safe.  Callers asking for a
    key being built wait for that build instead of building it again."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self.builds = 0  # how many values were built (for tests and benchmarks)
        self._values: OrderedDict[Hashable, T] = OrderedDict()
        self._building: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """The value for ``key``, from ``build()`` if no caller has built it."""
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
            building = self._building.setdefault(key, threading.Lock())
        with building:  # the first caller builds; the others wait here, then find it kept
            with self._lock:
                if key in self._values:
                    return self._values[key]
            try:
                value = build()
            except BaseException:
                with self._lock:
                    self._building.pop(key, None)
                raise
            with self._lock:
                self.builds += 1
                self._values[key] = value
                self._building.pop(key, None)
                while len(self._values) > self.kept:
                    self._values.popitem(last=False)
        return value
