"""A school day without a restart: successive new sessions, and what the server keeps of each.

``sessions`` clients come one after another, as pupils reloading the page would; each is a
new session that runs ``runs`` short replays in the Live tab and closes.  After each the
benchmark waits for the server to notice the closed client (Gradio's heartbeat, then its
unload event releases the session) and reads the server's resident memory.  A warm-up
session first (the model loads and every code path runs once) makes the starting point.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections.abc import Callable

from .browser import BenchError
from .served import PeakSampler, Replay, Served, client, rss_bytes

MIB = 2**20
RELEASE_SLACK = 2.0  # seconds past one heartbeat for the unload event to run
MILESTONE = 5  # the session after which memory should stay flat (the "after 5 sessions")


@dataclass
class SoakResult:
    """RSS in bytes: after the warm-up session, then after each counted session; the peak sampled."""

    replay: Replay
    runs: int
    start: int
    after: list[int] = field(default_factory=list)
    peak: int = 0
    seconds: float = 0.0

    @property
    def sessions(self) -> int:
        return len(self.after)

    @property
    def milestone(self) -> int | None:
        """RSS after the 5th session (``None`` with fewer)."""
        return self.after[MILESTONE - 1] if self.sessions >= MILESTONE else None

    @property
    def growth_per_session(self) -> float:
        """Bytes per finished session: from the 5th to the last (from the start with 5 or fewer)."""
        if self.sessions > MILESTONE:
            return (self.after[-1] - self.after[MILESTONE - 1]) / (self.sessions - MILESTONE)
        return (self.after[-1] - self.start) / self.sessions if self.after else 0.0

    @property
    def end_vs_milestone(self) -> float | None:
        """RSS at the end ÷ RSS after the 5th session."""
        return self.after[-1] / self.milestone if self.milestone and self.sessions > MILESTONE else None


def one_session(served: Served, replay: Replay, runs: int) -> None:
    """A new client runs ``runs`` replays through ``/generate`` and closes."""
    session = client(served.url)
    try:
        statuses = [str(session.predict(**replay.request(), api_name="/generate")[0]) for _ in range(runs)]
    except Exception as exc:  # the app reported an error, or the connection broke
        raise BenchError(f"a replay failed: {exc}") from None
    finally:
        session.close()
    for status in statuses:
        if not status.startswith("Done:"):
            raise BenchError(f"a replay ended with {status!r}")


def soak(
    served: Served,
    replay: Replay,
    sessions: int,
    runs: int,
    settle: float | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> SoakResult:
    """Run a warm-up session, then ``sessions`` sessions of ``runs`` replays each; RSS after each
    once the server had ``settle`` seconds (default: one heartbeat and a little) to release it."""
    if served.pid is None:
        raise BenchError("the soak reads the server's memory: give the process id of the app at --url (--pid)")
    if sessions < 1 or runs < 1:
        raise BenchError("--sessions and --runs must be at least 1")
    wait = served.heartbeat + RELEASE_SLACK if settle is None else settle
    begun = time.monotonic()
    with PeakSampler(served.pid) as sampler:
        one_session(served, replay, 1)
        time.sleep(wait)
        result = SoakResult(replay, runs, rss_bytes(served.pid))
        progress(f"warm-up done: RSS {result.start / MIB:.0f} MiB")
        for number in range(1, sessions + 1):
            one_session(served, replay, runs)
            time.sleep(wait)
            result.after.append(rss_bytes(served.pid))
            progress(f"session {number}/{sessions}: RSS {result.after[-1] / MIB:.0f} MiB")
    result.peak, result.seconds = sampler.peak, time.monotonic() - begun
    return result


def soak_table(result: SoakResult) -> str:
    """The result as a Markdown table (MiB)."""

    def mib(value: float | None) -> str:
        return "–" if value is None else f"{value / MIB:.0f}"

    ratio = result.end_vs_milestone
    rows = [
        ("server RSS at start (after a warm-up session)", mib(result.start)),
        (f"after {MILESTONE} sessions", mib(result.milestone)),
        (f"at the end ({result.sessions} sessions)", mib(result.after[-1])),
        ("peak (sampled every 0.2 s)", mib(result.peak)),
        ("growth per finished session (MiB)", f"{result.growth_per_session / MIB:.2f}  (target ≤ 2)"),
        (f"end ÷ after {MILESTONE}", "–" if ratio is None else f"{ratio:.3f}  (target ≤ 1.10)"),
    ]
    replay = result.replay
    lines = [
        f"{result.sessions} sessions × {result.runs} replays of {replay.tokens} trace tokens "
        f"({replay.preset}, h2o budget 256, interval {replay.interval}) in {result.seconds:.0f} s",
        "",
        "| server memory | MiB |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines) + "\n"
