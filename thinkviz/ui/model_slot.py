"""The one model every browser session shares: loaded in the background, used one run at a time.

Loading happens in a thread so the page is usable at once; :meth:`ModelSlot.watch` yields
the loader's progress messages for the UI to show.  :attr:`ModelSlot.room` says who shares the
model and keeps its line (:mod:`.room`).  Runs borrow the model with
:meth:`ModelSlot.use`, which waits for a load in progress and holds a lock for the whole
run: the engine's attention hooks live on the model, so two runs must never overlap.
(The room's line already lets one model-using event at a time run; the lock makes it a rule.)
A new model replaces the old one by reference, so a run in progress keeps the model it
started with.  Right after loading, a short calibration measures how fast the model runs on this
machine (:func:`~thinkviz.measure.estimate.measure_speed`): the status lines' run-time estimates.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from collections.abc import Callable, Iterator

from ..measure.estimate import Speed, measure_speed
from ..models.loading import LoadedModel, ModelLoadError, load_model
from .room import Room


log = logging.getLogger(__name__)


class ModelUnavailable(RuntimeError):
    """No model can be used: loading failed (the message says why) or nothing was loaded."""


@dataclass(frozen=True)
class LoadStatus:
    """Where loading stands: ``fraction`` in [0, 1], a message, the error if no model is usable,
    and a ``note`` when a new model failed to load but the previous one is still in use."""

    name: str
    quantization: str
    fraction: float
    message: str
    error: str | None = None
    ready: bool = False
    note: str | None = None

    @property
    def done(self) -> bool:
        return self.ready or self.error is not None


Loader = Callable[..., LoadedModel]


class ModelSlot:
    """Holds the shared :class:`~thinkviz.models.loading.LoadedModel` and its loading progress."""

    def __init__(self, device: str | None = None, loader: Loader = load_model) -> None:
        self.device = device
        self._loader = loader
        self._loaded: LoadedModel | None = None
        self._loaded_as: tuple[str, str] = ("", "")  # the (name, quantization) it was asked for
        self._status = LoadStatus("", "", 0.0, "No model loaded yet")
        self._changed = threading.Condition()
        self._run_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._speeds: dict[int, Speed] = {}  # id(model) -> its speed on this machine
        self.room = Room()  # who shares the model and its line (build_app sets the app's own)
        self.room.line.fallback = self.seconds_per_token

    @property
    def status(self) -> LoadStatus:
        with self._changed:
            return self._status

    @property
    def loaded(self) -> LoadedModel | None:
        return self._loaded

    @property
    def speed(self) -> Speed | None:
        """How fast the loaded model runs here (measured once it loaded, corrected by every run)."""
        loaded = self._loaded
        return None if loaded is None else self._speeds.get(id(loaded))

    def seconds_per_token(self) -> float | None:
        """About how long one token of one run takes here (a decode step after 256 cached tokens, as
        measured and corrected): what the model's line prices a job by before it has timed one."""
        speed = self.speed
        return None if speed is None else speed.forward(1, 256) * speed.correction

    @contextmanager
    def between_runs(self) -> Iterator[None]:
        """Hold the model between two runs (none starts meanwhile), for a change a run must not see."""
        with self._run_lock:
            yield

    def start_once(self, name: str, quantization: str) -> None:
        """Start loading ``name`` if no model was ever asked for (a new page must not replace the
        model someone chose in Settings)."""
        with self._changed:
            if self._status.name:
                return
        self.start(name, quantization)

    def start(self, name: str, quantization: str) -> None:
        """Begin loading ``name`` in the background unless it is loaded or loading already."""
        with self._changed:
            current = self._status
            same = (current.name, current.quantization) == (name, quantization)
            if same and (current.error is None) and (current.ready or not current.done):
                return
            if self._thread is not None and self._thread.is_alive():
                raise ModelUnavailable(f"{current.name} is still loading; wait for it before loading another model")
            self._status = LoadStatus(name, quantization, 0.0, f"Loading {name} ({quantization})")
            self._changed.notify_all()
            self._thread = threading.Thread(target=self._load, args=(name, quantization), daemon=True)
            self._thread.start()

    def _load(self, name: str, quantization: str) -> None:
        def progress(fraction: float, message: str) -> None:
            self._set(LoadStatus(name, quantization, float(fraction), message))

        try:
            loaded = self._loader(name, quantization, self.device, progress=progress)
        except Exception as exc:  # a boundary: the UI must see a message, not a dead thread
            reason = str(exc) if isinstance(exc, ModelLoadError) else f"{type(exc).__name__}: {exc}"
            previous = self._loaded
            if previous is None:
                self._set(LoadStatus(name, quantization, 1.0, "Loading failed", error=reason))
            else:  # keep serving the model that works
                in_use = f"{previous.name} ({previous.quantization}, {previous.device})"
                self._set(
                    LoadStatus(
                        *self._loaded_as,
                        1.0,
                        f"Ready: {in_use}, still in use",
                        ready=True,
                        note=f"Could not load {name}: {reason}",
                    )
                )
            return
        self._set(LoadStatus(name, quantization, 0.99, "Measuring this machine's speed (for run-time estimates)…"))
        try:
            speed = measure_speed(loaded)
        except Exception:  # a boundary: without a measurement, runs only go without an estimate
            log.warning("could not measure the speed of %s", loaded.name, exc_info=True)
            speed = None
        self._loaded, self._loaded_as = loaded, (name, quantization)
        self._speeds = {id(loaded): speed} if speed is not None else {}
        self._set(
            LoadStatus(
                name, quantization, 1.0, f"Ready: {loaded.name} ({loaded.quantization}, {loaded.device})", ready=True
            )
        )

    def _set(self, status: LoadStatus) -> None:
        with self._changed:
            self._status = status
            self._changed.notify_all()

    def watch(self, poll: float = 0.25) -> Iterator[LoadStatus]:
        """Yield the status now and whenever it changes, until loading ends."""
        last = None
        while True:
            with self._changed:
                if self._status == last:
                    self._changed.wait(timeout=poll)
                status = self._status
            if status != last:
                last = status
                yield status
            if status.done:
                return

    def wait(self, timeout: float | None = None) -> LoadStatus:
        """Block until the current load ends (or ``timeout`` seconds pass); return the status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self._status.done and self._status.name:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._changed.wait(timeout=remaining)
            return self._status

    @contextmanager
    def use(self) -> Iterator[LoadedModel]:
        """Borrow the model for one run (waits for a load in progress)."""
        status = self.wait()
        if status.error is not None:
            raise ModelUnavailable(f"The model could not be loaded: {status.error}")
        if self._loaded is None:
            raise ModelUnavailable("No model is loaded; open Settings and load one")
        with self._run_lock:
            yield self._loaded
