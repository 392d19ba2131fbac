"""A class pressing Generate at once: concurrent clients, each a session of its own.

``clients`` clients connect, wait at a barrier, then each submits one short replay to the
Live tab's ``/generate``.  The app runs one model event at a time (its concurrency group),
so the others queue.  Each client's request differs (its own budget, and its trace ends
a word earlier than the previous client's) and its recording, exported afterwards in its
own session, must be its own run: its budget, and the replayed text its trace ends with.
Queue wait is submit → the run's first frame.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from ..export import import_recording
from .browser import BenchError
from .served import Replay, Served, client


@dataclass(frozen=True)
class ClientRun:
    """One client's run: seconds from its submit to the first frame and to the end, and whether
    its recording was its own (budget and replayed text)."""

    client: int
    budget: int
    events: int  # steps in its recording
    queue_wait: float
    total: float
    status: str
    own: bool


@dataclass(frozen=True)
class LoadResult:
    replay: Replay
    runs: list[ClientRun]
    seconds: float  # first submit → last run done

    @property
    def waits(self) -> list[float]:
        return [run.queue_wait for run in self.runs]


def client_replay(replay: Replay, number: int) -> Replay:
    """Client ``number``'s replay: the shared one without its last ``number`` words, so no two
    clients replay the same text."""
    words = replay.trace.split(" ")
    if number >= len(words):
        raise BenchError(f"the trace has {len(words)} words: too short for {number + 1} different clients")
    return replay if number == 0 else replace(replay, trace=" ".join(words[: len(words) - number]))


def one_client(served: Served, replay: Replay, number: int, barrier: threading.Barrier) -> ClientRun:
    own, budget = client_replay(replay, number), 64 + 8 * number
    session = client(served.url)
    try:
        barrier.wait()
        submitted, first = time.monotonic(), None
        job = session.submit(**own.request(budget=budget), api_name="/generate")
        for _ in job:  # each frame as it streams
            first = first or time.monotonic()
        status = str(job.result()[0])
        finished = time.monotonic()
        record = import_recording([session.predict(api_name="/export_recording")])
    except Exception as exc:  # the app reported an error, or the connection broke
        raise BenchError(f"client {number} failed: {exc}") from None
    finally:
        session.close()
    mine = is_own(record, own, budget)
    return ClientRun(
        number, budget, len(record.events), (first or finished) - submitted, finished - submitted, status, mine
    )


def is_own(record, own: Replay, budget: int) -> bool:
    """Whether ``record`` is the run of ``own`` at ``budget``: its budget, and the replayed text its trace ends with."""
    replayed = record.generated_text.strip()  # the trace after what the prompt took (its opening <think>)
    return record.meta.get("budget") == budget and bool(replayed) and own.trace.rstrip().endswith(replayed)


def load(served: Served, replay: Replay, clients: int) -> LoadResult:
    """``clients`` concurrent sessions, one replay each; raises :class:`BenchError` if any run
    fails, does not finish or comes back with another client's recording."""
    if clients < 1:
        raise BenchError("--clients must be at least 1")
    barrier = threading.Barrier(clients)
    begun = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        runs = list(pool.map(lambda number: one_client(served, replay, number, barrier), range(clients)))
    seconds = time.monotonic() - begun
    unfinished = [run.client for run in runs if not run.status.startswith("Done:")]
    if unfinished:
        raise BenchError(f"clients {unfinished} did not finish: {[runs[i].status for i in unfinished]}")
    strangers = [run.client for run in runs if not run.own]
    if strangers:
        raise BenchError(f"clients {strangers} received a recording that is not their own run")
    return LoadResult(replay, runs, seconds)


def load_table(result: LoadResult) -> str:
    """The result as Markdown: one row per client, then the queue wait and the total time."""
    waits = result.waits
    lines = [
        f"{len(result.runs)} concurrent clients, one replay each (~{result.replay.tokens} trace tokens of "
        f"{result.replay.preset}, h2o, interval {result.replay.interval}; client k: budget 64 + 8k, "
        "its trace k words shorter)",
        "",
        "| client | budget | events | queue wait (s) | submit → done (s) | own result |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {run.client} | {run.budget} | {run.events} | {run.queue_wait:.1f} | {run.total:.1f} | "
        f"{'yes' if run.own else 'NO'} |"
        for run in result.runs
    ]
    lines += [
        "",
        f"queue wait: median {statistics.median(waits):.1f} s, max {max(waits):.1f} s; "
        f"total {result.seconds:.1f} s for {len(result.runs)} runs",
    ]
    return "\n".join(lines) + "\n"
