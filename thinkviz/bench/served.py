"""What the soak and load benchmarks share: the app they drive, the short replay each client
asks for, and the server's resident memory.

A client is a ``gradio_client.Client``, a session of its own, exactly as the app sees a
browser tab; it runs a replay through the Live tab's ``/generate`` endpoint by parameter
name, so the request does not depend on the order of the controls.  The app is started
with :func:`~thinkviz.bench.browser.app_process` (any model ``app.py`` takes, a local
folder too: the tests serve a tiny one) or is one already running (``--url``).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from ..models.loading import embedded_tokenizer
from ..measure.replay import load_trace
from .browser import BenchError, app_process

HEARTBEAT_SECONDS = 1.0  # Gradio's heartbeat for an app the benchmark starts (GRADIO_HEARTBEAT_INTERVAL)
DEFAULT_HEARTBEAT_SECONDS = 15.0  # Gradio's own default, for an app started elsewhere
CLIENT_TIMEOUT = 300.0  # seconds for one HTTP call: httpx's default 5 s fails a soak on a starved machine


@dataclass(frozen=True)
class Replay:
    """One short replay: a preset's question and the first ``tokens`` tokens of its trace, run by
    h2o compressing every ``interval`` tokens (1, the Live tab's default: an event per token)."""

    preset: str
    question: str
    system: str
    trace: str
    tokens: int
    interval: int = 1

    def request(self, budget: int = 256) -> dict[str, Any]:
        """``/generate``'s arguments by name (h2o, no end-of-text stop; the rest as the page starts)."""
        return {
            "run_mode": "replay",
            "question": self.question,
            "system": self.system,
            "trace": self.trace,
            "policy": "h2o",
            "budget": budget,
            "interval": self.interval,
            "stop_at_eos": False,
        }


def short_replay(preset: str, tokens: int, interval: int = 1) -> Replay:
    """``preset``'s trace cut to its first ``tokens`` tokens (the shared tokenizer's)."""
    if tokens < 1 or not 1 <= interval <= 512:
        raise BenchError(
            f"a replay needs at least one trace token (not {tokens}) and an interval of 1–512 (not {interval})"
        )
    try:
        trace = load_trace(preset)
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot load the trace of {preset!r}: {exc}") from None
    tokenizer = embedded_tokenizer()
    ids = tokenizer(trace.text, add_special_tokens=False)["input_ids"][:tokens]
    return Replay(preset, trace.question, trace.system or "", tokenizer.decode(ids), len(ids), interval)


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (Linux ``/proc/PID/status``, ``VmRSS``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as exc:
        raise BenchError(f"cannot read the memory of process {pid}: {exc}") from None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"/proc/{pid}/status has no VmRSS line")


class PeakSampler:
    """Samples a process's RSS every ``interval`` seconds in a thread; :attr:`peak` is the highest seen."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval, self.peak = pid, interval, rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except BenchError:  # the server went away; the benchmark reports that itself
                return

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class Served:
    """An app to drive: its URL, its process id (``None``: memory unknown) and its heartbeat."""

    url: str
    pid: int | None
    heartbeat: float


@contextmanager
def served_app(url: str | None, pid: int | None, app_args: list[str]) -> Iterator[Served]:
    """The app at ``url`` (process ``pid``, if known), or ``app.py app_args`` started for the run
    with a one-second heartbeat, so that a closed client is noticed (and its session released)
    within a second rather than Gradio's fifteen."""
    if url:
        yield Served(url, pid, DEFAULT_HEARTBEAT_SECONDS)
        return
    env = {"GRADIO_HEARTBEAT_INTERVAL": str(HEARTBEAT_SECONDS)}
    with app_process(app_args, env=env) as (started, process):
        yield Served(started, process, HEARTBEAT_SECONDS)


def client(url: str, auth: tuple[str, str] | None = None):
    """A new session on the app (behind ``auth``'s login, if given): a ``gradio_client.Client`` without
    its own progress output.

    Over plain ``http://`` it skips certificate verification, which has nothing to verify there: with
    it, gradio_client builds a TLS context (loading the whole CA bundle, tens of milliseconds of CPU)
    for every request and every stream it opens, and thirty clients doing so at once measured their
    own start-up: a trivial round trip to the app took 1.6 s at the median with it, 0.17 s without."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from gradio_client import Client  # DEFERRED: the rest of the CLI runs without gradio_client

    verify = not url.startswith("http://")
    try:
        return Client(url, verbose=False, auth=auth, ssl_verify=verify, httpx_kwargs={"timeout": CLIENT_TIMEOUT})
    except Exception as exc:  # httpx errors, a page that is not a Gradio app
        raise BenchError(f"cannot connect to {url}: {exc}") from None
