"""Per-browser-session state (kept in a ``gr.State``; nothing here is shared between sessions),
the recordings a session keeps, and how a session lets go of all of it.

A session keeps its finished runs on a :class:`Shelf` (what Explore offers), within a byte
budget: the oldest go first, except the runs a tab still shows.

Release: when a browser tab closes or reloads, or a ``gradio_client.Client`` closes (either
way its heartbeat connection drops), :func:`thinkviz.ui.app.build_app` releases the session
through Gradio's ``Blocks.unload`` event: :meth:`Session.close` stops its run and drops its
runs, recordings and token-view channels, and Gradio's own record of the session goes too.
Gradio 6's other two hooks do not fit this state: ``gr.State(time_to_live=…,
delete_callback=…)`` only tracks a state that a handler has *returned* (``SessionState.
__setitem__`` starts the clock; a ``Session`` is changed in place and never returned), and
once the tab closes it waits ``STATE_TTL_WHEN_CLOSED`` (an hour) before deleting anything.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
from dataclasses import dataclass, field
from collections.abc import Iterable, Sequence

from ..core.events import RunRecord
from ..units import format_bytes
from ..viz.tables import record_kv_quant
from ..viz.tokens import TokenData
from .stream import TokenChannel

LIVE_TOKENS_ID = "tv-live-tokens"
COMPARE_TOKENS_IDS = tuple(f"tv-compare-tokens-{i}" for i in range(6))
RECORDING_BUDGET = 256 * 2**20  # bytes of recordings one session keeps (RunRecord.nbytes)


@dataclass
class Shelf:
    """A session's finished runs by label, oldest first, within ``budget`` bytes of recordings.

    :meth:`keep` adds a run, then drops the oldest runs while the shelf is over its budget,
    except those in ``pinned`` (what a tab shows now: dropping them would free nothing).
    """

    budget: int = RECORDING_BUDGET
    records: dict[str, RunRecord] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)  # how many runs each source ("Live", "Compare") kept
    note: str = ""  # what the last keep dropped, for the run picker

    def keep(
        self,
        source: str,
        records: Iterable[RunRecord],
        pinned: Iterable[RunRecord] = (),
        titles: Sequence[str] | None = None,
    ) -> list[str]:
        """Add ``records`` (one run of ``source``) as ``"<source> <n> · <title>"``, then :meth:`trim`;
        returns their labels.  A record's title is ``titles[i]`` (Compare's column titles, which tell
        one policy's columns apart), else its policy and its KV format when quantized."""
        self.runs[source] = number = self.runs.get(source, 0) + 1
        labels = []
        for i, record in enumerate(records):
            if titles is not None:
                title = titles[i]
            else:
                fmt = record_kv_quant(record)
                kv = f" · {fmt.label}" if fmt.spec.quantized else ""  # full and full · q4_0 are two entries
                title = f"{record.meta.get('policy', '?')}{kv}"
            label = f"{source} {number} · {title}"
            self.records[label] = record
            labels.append(label)
        self.trim([*pinned, *(self.records[label] for label in labels)])
        return labels

    def trim(self, pinned: Iterable[RunRecord] = ()) -> None:
        """Drop the oldest runs while over budget, except ``pinned``; :attr:`note` says which went.
        (A run shelved at its start grows while it streams: trim again when it ends.)"""
        pinned = list(pinned)
        dropped = []
        for label, record in list(self.records.items()):
            if self.nbytes() <= self.budget:
                break
            if not any(record is shown for shown in pinned):
                dropped.append(label)
                del self.records[label]
        self.note = (
            f"Dropped {', '.join(dropped)}: this session keeps {format_bytes(self.budget)} of recordings, "
            "the oldest go first."
            if dropped
            else ""
        )

    def nbytes(self) -> int:
        return sum(record.nbytes for record in self.records.values())

    def labels(self) -> list[str]:
        """Newest first, as the run picker lists them."""
        return list(reversed(self.records))

    def get(self, label: str) -> RunRecord | None:
        return self.records.get(label)

    def clear(self) -> None:
        self.records.clear()
        self.note = ""


@dataclass
class Session:
    """What one browser tab has run and is running.

    Gradio deep-copies a new session before first use, so it starts without a cancel event
    (a lock cannot be copied); :meth:`begin` makes one per run.
    """

    cancel: threading.Event | None = None
    running: bool = False
    live_channel: TokenChannel = field(default_factory=lambda: TokenChannel(LIVE_TOKENS_ID))
    live_view: TokenData | None = None  # the Live tab's last frame, to re-render in another mode
    live_record: RunRecord | None = None
    live_device_stats: dict[int, dict] = field(default_factory=dict)  # step -> device memory sampled then
    compare_channels: list[TokenChannel] = field(
        default_factory=lambda: [TokenChannel(target) for target in COMPARE_TOKENS_IDS]
    )
    compare_views: list[TokenData] = field(default_factory=list)
    compare_records: dict[str, RunRecord] = field(default_factory=dict)  # by column label
    compare_fidelity: list = field(default_factory=list)  # each column's TokenFidelity (None: not measured)
    explore_record: RunRecord | None = None
    explore_steps: int = 0  # how many steps the explored record had when Explore opened it
    sweep_rows: list[dict] = field(default_factory=list)
    shelf: Shelf = field(default_factory=Shelf)
    room_seen: int = 0  # the teacher's pushes this session has opened (thinkviz.ui.room.Push.number)

    def stop(self) -> None:
        """Ask the running run, if any, to stop after its current step."""
        if self.cancel is not None:
            self.cancel.set()

    def resync(self) -> None:
        """The browser missed a token-view message: every view's next message is a reset."""
        for channel in (self.live_channel, *self.compare_channels):
            channel.resync()

    def begin(self) -> threading.Event:
        """A fresh cancel event for a new run (Stop sets it)."""
        self.cancel = threading.Event()
        self.running = True
        return self.cancel

    def shown(self) -> list[RunRecord]:
        """The records a tab shows now (never dropped from the shelf)."""
        held = [self.live_record, *self.compare_records.values(), self.explore_record]
        return [record for record in held if record is not None]

    def keep_live(self, record: RunRecord) -> str:
        """Shelve a Live run (from its first frame on); returns its label in the run picker."""
        return self.shelf.keep("Live", [record], self.shown())[0]

    def keep_compare(self, records: Iterable[RunRecord], titles: Sequence[str] | None = None) -> list[str]:
        """Shelve a comparison, one entry per column (titled ``titles[i]`` when given)."""
        return self.shelf.keep("Compare", records, self.shown(), titles)

    def trim(self) -> None:
        """A shelved run has ended, at its full size: bring the shelf back within its budget."""
        self.shelf.trim(self.shown())

    def sources(self) -> list[str]:
        """Runs the Explore tab can open, newest first."""
        return self.shelf.labels()

    def record_for(self, source: str) -> RunRecord | None:
        return self.shelf.get(source)

    def close(self) -> None:
        """The tab is gone: stop its run and let go of every run, recording and channel it holds."""
        self.stop()
        self.live_channel = TokenChannel(LIVE_TOKENS_ID)
        self.compare_channels = [TokenChannel(target) for target in COMPARE_TOKENS_IDS]
        self.live_view = self.live_record = self.explore_record = None
        self.live_device_stats, self.compare_views, self.compare_records, self.sweep_rows = {}, [], {}, []
        self.shelf.clear()


def release(demo, state_id: int, session_hash: str) -> None:
    """Close the :class:`Session` that browser session ``session_hash`` holds in the ``gr.State``
    with id ``state_id``, then drop Gradio's record of the session (its state and its copies of
    the components' settings), which Gradio itself would keep for an hour, or until
    ``state_session_capacity`` newer sessions push it out.

    ``demo.state_holder`` is where Gradio keeps every session's values (``gradio/state_holder.py``:
    its ``lock``, ``session_data`` and ``time_last_used``); the release test checks, with weak
    references, that this still frees everything with the installed Gradio.
    """
    holder = getattr(demo, "state_holder", None)  # set when the app is launched
    if holder is None or session_hash not in holder:
        return
    session = holder[session_hash].get(state_id)
    if isinstance(session, Session):
        session.close()
    with holder.lock:
        holder.session_data.pop(session_hash, None)
        holder.time_last_used.pop(session_hash, None)
    give_back_memory_soon()


_LIBC = ctypes.util.find_library("c")
TRIM_DELAY = 2.0  # seconds after the last release: a room leaving at once frees its memory in one pass
_trim_lock = threading.Lock()
_trim_timer: threading.Timer | None = None


def give_back_memory() -> None:
    """Collect what released sessions left (their runs hold cycles) and hand the freed heap back to the
    system (glibc's ``malloc_trim``: the streams of a room run on many threads, each with its own heap
    arena, which otherwise keeps its peak size: measured, 30 playbacks left the server 365 MiB above
    its start after every session was released, 200 MiB with only ``gc.collect``)."""
    gc.collect()
    if _LIBC:
        try:
            ctypes.CDLL(_LIBC).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


def give_back_memory_soon() -> None:
    """:func:`give_back_memory` once, :data:`TRIM_DELAY` seconds after the last call (in a thread)."""
    global _trim_timer
    with _trim_lock:
        if _trim_timer is not None:
            _trim_timer.cancel()
        _trim_timer = threading.Timer(TRIM_DELAY, give_back_memory)
        _trim_timer.daemon = True
        _trim_timer.start()
