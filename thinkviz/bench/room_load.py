"""A room full of laptops: ``clients`` concurrent sessions playing recordings and, with ``live``, a few
live replays waiting in the model's line, all against one served app on loopback.

Each playing client opens its session (as a page does when it loads), then, all at once, plays one
preset's recording (the presets named taken in turn; a class usually plays one) through the Live
tab's ``/play`` and then exports what its session shows: it must be that preset's recorded run
(its policy, budget and number of steps), never another client's.  The recording was decoded
before (the warm-up plays it, as a page decodes a preset's recording when it is picked) unless
``cold``: then the server decodes it when the first client asks.  Its *first frame* is submit →
the first streamed update.  Each live client submits, in a fixed order a moment apart, one short
replay through ``/generate`` (:func:`~thinkviz.bench.load.client_replay`: its own budget and trace),
reads the wait its first status line shows ("2nd in line — about 40 s") and measures the real one
(submit → the first frame that is no longer a place in the line); they must start in the order
they arrived.  The server's resident memory is read before the load (the model loaded, one small
recording played: :func:`warm_up`) and after it (every client closed, its session released),
beside the decoded recordings the server keeps (:data:`~thinkviz.demos.record.CACHED_RECORDINGS`
of them at most, each priced by the memory it takes when this process decodes it).

Bounded: at most :data:`MAX_CLIENTS` clients, and every wait ends at ``timeout`` seconds.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..demos.record import CACHED_RECORDINGS, load_preset_recording, recording_problem
from ..export import import_recording
from ..units import format_bytes
from .browser import BenchError
from .load import client_replay, is_own
from .served import Replay, Served, client, rss_bytes

MAX_CLIENTS = 100
WARM_PRESET = "generate_muffins"  # the smallest recording: played once before the load, to warm the server
LIVE_STAGGER = 0.5  # seconds between two live clients' submits: their arrival order is known
RELEASE_WAIT = 10.0  # heartbeats after the clients close (released, memory given back) before memory is read again
LINE_RE = re.compile(r"(\d+)(?:st|nd|rd|th) in line — (?:(under 5 s)|about (?:(\d+) min)?\s*(?:(\d+) s)?)")


@dataclass(frozen=True)
class Expected:
    """What a preset's recorded Live run is: the client that played it must export exactly this."""

    preset: str
    policy: str
    budget: object
    events: int
    nbytes: int  # resident memory the decoded recording takes (measured by decoding it here)


@dataclass(frozen=True)
class PlayRun:
    client: int
    preset: str
    first_frame: float
    total: float
    frames: int
    own: bool


@dataclass(frozen=True)
class LiveRun:
    client: int
    submitted: float  # seconds after the load began
    started: float  # seconds after the load began: its first frame that is not a place in the line
    place: int  # the place its first status showed (0: it ran at once)
    shown_wait: float | None  # the wait that status showed, in seconds ("under 5 s": 2.5)
    real_wait: float
    total: float
    own: bool
    tracking: float | None = None  # median over its line updates of shown / real wait left then


@dataclass(frozen=True)
class RoomResult:
    plays: list[PlayRun]
    lives: list[LiveRun]
    replay: Replay | None
    speed: str
    rss_before: int
    rss_after: int
    held: int  # bytes of decoded recordings the server may keep, decoded during the load (cold)
    seconds: float
    cold: bool = False


def playable(names: list[str]) -> list[Expected]:
    """What the Live run of each preset in ``names`` is; :class:`BenchError` if one has no recording."""
    found = []
    for name in names:
        problem = recording_problem(name)
        if problem is not None:
            raise BenchError(f"preset {name!r} cannot be played: {problem}")
        recording = load_preset_recording(name)
        live = recording.records[recording.live]
        nbytes = decoded_bytes(name)
        found.append(Expected(name, live.meta.get("policy"), live.meta.get("budget"), len(live.events), nbytes))
    if not found:
        raise BenchError("name at least one preset to play")
    return found


DECODE_COST = """
import gc, os, sys
from thinkviz.bench.served import rss_bytes
from thinkviz.demos.record import load_preset_recording
import thinkviz.ui.live_run  # what a server has imported before it decodes
gc.collect()
before = rss_bytes(os.getpid())
recording = load_preset_recording(sys.argv[1])
gc.collect()
print(rss_bytes(os.getpid()) - before)
"""


def decoded_bytes(name: str) -> int:
    """The resident memory preset ``name``'s decoded recording takes (decoded in a fresh process: its
    Python objects weigh more than its arrays' bytes, about 39 MiB for 16 MiB of arrays)."""
    done = subprocess.run(
        [sys.executable, "-c", DECODE_COST, name], capture_output=True, text=True, env={**os.environ}, timeout=300
    )
    if done.returncode != 0:
        raise BenchError(f"cannot measure the recording of {name!r}: {done.stderr.strip()[-500:]}")
    return max(0, int(done.stdout.split()[-1]))


def shown_wait(status: str) -> tuple[int, float | None]:
    """The place and the seconds a line status shows (``(0, None)``: not a place in the line)."""
    match = LINE_RE.search(status)
    if match is None:
        return 0, None
    place, under, minutes, seconds = match.groups()
    if under:
        return int(place), 2.5
    return int(place), 60.0 * int(minutes or 0) + int(seconds or 0)


def deadline_left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise BenchError("the load did not finish within --timeout")
    return left


def play_client(served: Served, expected: Expected, number: int, speed: str, start: threading.Barrier, deadline):
    session = client(served.url)
    try:
        session.predict(api_name="/stop")  # the session exists before Play, as a page's does once it loaded
        start.wait()
        submitted, first, frames = time.monotonic(), None, 0
        job = session.submit(preset=expected.preset, speed=speed, api_name="/play")
        for _ in job:
            first, frames = first or time.monotonic(), frames + 1
            deadline_left(deadline)
        job.result(timeout=deadline_left(deadline))
        finished = time.monotonic()
        record = import_recording([session.predict(api_name="/export_recording")])
    except BenchError:
        raise
    except Exception as exc:  # the app reported an error, or the connection broke
        raise BenchError(f"playing client {number} failed: {exc}") from None
    finally:
        session.close()
    own = (record.meta.get("policy"), record.meta.get("budget"), len(record.events)) == (
        expected.policy,
        expected.budget,
        expected.events,
    )
    return PlayRun(number, expected.preset, (first or finished) - submitted, finished - submitted, frames, own)


def live_client(served: Served, replay: Replay, number: int, start: threading.Barrier, began, deadline) -> LiveRun:
    own, budget = client_replay(replay, number), 64 + 8 * number
    session = client(served.url)
    try:
        start.wait()
        time.sleep(LIVE_STAGGER * (number + 1))  # a known arrival order, behind the first playbacks
        submitted, started, place, shown, updates = time.monotonic(), None, None, None, []
        job = session.submit(**own.request(budget=budget), api_name="/generate")
        for output in job:
            where, seconds = shown_wait(str(output[0]))
            if place is None:
                place, shown = where, seconds
            if where == 0 and started is None:
                started = time.monotonic()
            elif where and seconds is not None:
                updates.append((time.monotonic(), seconds))
            deadline_left(deadline)
        status = str(job.result(timeout=deadline_left(deadline))[0])
        finished = time.monotonic()
        record = import_recording([session.predict(api_name="/export_recording")])
    except BenchError:
        raise
    except Exception as exc:
        raise BenchError(f"live client {number} failed: {exc}") from None
    finally:
        session.close()
    if not status.startswith("Done:"):
        raise BenchError(f"live client {number} did not finish: {status}")
    started = started or finished
    mine = is_own(record, own, budget)
    ratios = [seconds / (started - at) for at, seconds in updates if started - at >= 1.0]
    tracking = statistics.median(ratios) if ratios else None
    return LiveRun(
        number,
        submitted - began,
        started - began,
        place or 0,
        shown,
        started - submitted,
        finished - submitted,
        mine,
        tracking,
    )


def warm_up(served: Served, deadline: float, presets: list[str]) -> None:
    """A one-token generation (the model loaded and timed) and a playback at full speed of
    :data:`WARM_PRESET` (what every playback runs once in a process, figures included) and of
    ``presets`` (decoded, as a page decodes a preset's recording when it is picked) before memory is read."""
    session = client(served.url)
    try:
        job = session.submit(
            run_mode="generate", question="Hi", policy="h2o", budget=64, max_new_tokens=1, api_name="/generate"
        )
        job.result(timeout=deadline_left(deadline))
        for preset in [WARM_PRESET, *presets]:
            job = session.submit(preset=preset, speed="as fast as it draws", api_name="/play")
            job.result(timeout=deadline_left(deadline))
    except BenchError:
        raise
    except Exception as exc:
        raise BenchError(f"the warm-up run failed: {exc}") from None
    finally:
        session.close()


def room_load(
    served: Served,
    clients: int,
    presets: list[str],
    speed: str,
    replay: Replay | None,
    live: int,
    timeout: float,
    cold: bool = False,
) -> RoomResult:
    """``clients`` playing clients and ``live`` live ones (with a ``replay``) at once; raises
    :class:`BenchError` if any fails, comes back with another's result or runs out of time.
    ``cold``: the recordings are not decoded before (the very first play of them on this server)."""
    if not 1 <= clients <= MAX_CLIENTS or not 0 <= live <= clients:
        raise BenchError(f"--clients must be 1–{MAX_CLIENTS} and the live runs 0–--clients, not {clients}, {live}")
    deadline = time.monotonic() + timeout
    expected = playable(presets)
    warm_up(served, deadline, [] if cold else presets)
    before = rss_bytes(served.pid) if served.pid else 0
    start = threading.Barrier(clients + live)
    began = time.monotonic()
    with ThreadPoolExecutor(clients + live) as pool:
        plays = [
            pool.submit(play_client, served, expected[i % len(expected)], i, speed, start, deadline)
            for i in range(clients)
        ]
        lives = [pool.submit(live_client, served, replay, i, start, began, deadline) for i in range(live)]
        plays, lives = [f.result() for f in plays], [f.result() for f in lives]
    seconds = time.monotonic() - began
    if served.pid:  # memory is read: every closed client's session released first
        time.sleep(RELEASE_WAIT * served.heartbeat)
    after = rss_bytes(served.pid) if served.pid else 0
    strangers = [r.client for r in plays if not r.own] + [f"live {r.client}" for r in lives if not r.own]
    if strangers:
        raise BenchError(f"clients {strangers} received a result that is not their own")
    held = sum(sorted((e.nbytes for e in expected), reverse=True)[:CACHED_RECORDINGS]) if cold else 0
    return RoomResult(plays, lives, replay, speed, before, after, held, seconds, cold)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def room_table(result: RoomResult) -> str:
    """The result as Markdown: playbacks' first frames, the live runs' waits, the server's memory."""
    firsts = [run.first_frame for run in result.plays]
    presets = sorted({run.preset for run in result.plays})
    lines = [
        f"{len(result.plays)} concurrent playbacks at {result.speed} of {', '.join(presets)} "
        f"({'cold: its first play on this server' if result.cold else 'decoded before, as picking the preset does'})"
        + (f", with {len(result.lives)} live replays" if result.lives else ""),
        "",
        "| playbacks | first frame p50 (s) | p95 (s) | max (s) | slowest playback (s) | own result |",
        "|---|---|---|---|---|---|",
        f"| {len(firsts)} | {statistics.median(firsts):.2f} | {percentile(firsts, 0.95):.2f} | {max(firsts):.2f} | "
        f"{max(run.total for run in result.plays):.1f} | {sum(run.own for run in result.plays)}/{len(firsts)} |",
    ]
    if result.lives:
        lines += live_rows(result)
    before, after = result.rss_before, result.rss_after
    if before:
        bound = 1.10 * before + result.held
        lines += [
            "",
            f"server RSS: before {format_bytes(before)}, after {format_bytes(after)} "
            f"({(after - before) / before:+.1%}); bound 110 % of before + {format_bytes(result.held)} of "
            f"recordings it may keep = {format_bytes(int(bound))}: {'within' if after <= bound else 'OVER'}",
        ]
    lines.append(f"total {result.seconds:.1f} s")
    return "\n".join(lines) + "\n"


def live_rows(result: RoomResult) -> list[str]:
    lives = sorted(result.lives, key=lambda run: run.submitted)
    in_order = [run.client for run in lives] == [run.client for run in sorted(lives, key=lambda run: run.started)]
    rows = [
        "",
        "| live client | budget | submitted (s) | place shown | wait shown (s) | real wait (s) | shown / real "
        "| shown / real left, median of its updates | own |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in lives:
        ratio = f"{run.shown_wait / run.real_wait:.2f}" if run.shown_wait and run.real_wait > 0 else "–"
        shown = "–" if run.shown_wait is None else f"{run.shown_wait:.0f}"
        tracking = "–" if run.tracking is None else f"{run.tracking:.2f}"
        rows.append(
            f"| {run.client} | {64 + 8 * run.client} | {run.submitted:.1f} | {run.place} | {shown} | "
            f"{run.real_wait:.1f} | {ratio} | {tracking} | {'yes' if run.own else 'NO'} |"
        )
    rows += ["", f"live runs started in arrival order: {'yes' if in_order else 'NO'}"]
    return rows
