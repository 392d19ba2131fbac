"""A room full of laptops: the model's fair line, the caps on a student's run, who is the teacher, and
the presets the teacher pushes to everyone.  No Gradio components here (:mod:`.room_panel` wires them).

**The line.**  Every event that runs the model joins the :class:`Line` of its app in arrival order
and waits there for its turn, yielding a status line that says its place and an estimated wait
("3rd in line — about 40 s") as the line moves; a client (a browser tab's Gradio session) has at
most one job queued or running, a second one is refused (:class:`Refused`) with the place of the
first.  The estimate prices the running job by what its own run says is left (:func:`report_progress`:
the run's pace so far, which the server's load slows) and each job waiting ahead by its size (tokens ×
policies, :func:`run_size`) at the seconds per unit the line learnt on the last jobs of its kind
(before any, the model's calibrated speed), times how much slower than priced the model runs now
(the running job's slowdown, or the last one reported).  Gradio's queue lets many model events in
at once (:data:`LINE_LIMIT`) so that they can wait *here*, where each one sees its place; the model
itself still runs one job at a time.

**The room.**  :class:`Room` is off by default (loopback, no password, everyone may do everything).
Served to a room (``app.py --room``), the user named :attr:`Room.teacher` may load models, run
anything and push a preset to every session; everyone else is a student whose runs are capped at
:attr:`Room.cap` tokens × policies.  Who is asking comes from Gradio's own login
(``gr.Request.username``, which the handlers read from the event being handled and pass in:
:func:`thinkviz.ui.handlers.asker`).  Nothing here imports Gradio.
"""

from __future__ import annotations

import math
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterator

from ..measure.estimate import format_seconds

LINE_LIMIT = 96  # model events Gradio lets in at once: the ones beyond the first wait in the Line
PLAYBACK_LIMIT = 96  # recordings played at once (no model: they never wait for it)
VIEW_LIMIT = 96  # every other event (Explore, Learn, preset pickers): per event, Gradio's default limit
SERVER_THREADS = 256  # Gradio's worker threads (its default, 40, is fewer than a room's streams)
POLL_SECONDS = 1.0  # a waiting job's status line is refreshed at least this often
# Seconds a thread may hold the interpreter while another waits for it (Python's default: 0.005).  A
# forward pass hands the interpreter back at each of its ~3,700 torch calls and waits that long to get it
# again whenever another thread runs Python (a playback building its figures): measured on the embedded
# model, a 23 ms decode step took 18.6 s beside one busy thread at 5 ms, 2.6 s at 1 ms, 0.71 s at 0.2 ms.
# But a room's thirty playbacks at 0.2 ms thrash (~100,000 context switches a second, a third of the CPU
# in the kernel): under ``bench load --clients 30 --mixed`` the slowest playback took 107.9 s at 0.2 ms,
# 37.1 s at 1 ms, 37.5 s at 5 ms, and the live runs waited 121.6/132.9 s, 46.0/56.3 s, 47.4/58.2 s.
SWITCH_INTERVAL = 0.001
# Gradio's queue looks for a new event every millisecond while it has none (``Queue.sleep_when_free``;
# 50 ms on Windows) and for progress to send every 10 ms (``progress_update_sleep_when_free``): an idle
# app with no page open spent 7.5 % of a core on it (a one-Textbox Blocks, measured over 20 s; this app
# with the embedded model: 9 %).  At 20 ms and 100 ms: 1.1 %, for at most 20 ms before an event starts and
# progress bars that move ten times a second.  Gradio has no setting for either (its own 1 ms: a busy loop).
QUEUE_POLLS = {"sleep_when_free": 0.02, "progress_update_sleep_when_free": 0.1}
STALE_SECONDS = 30.0  # a waiting job nobody has polled for this long has lost its client: it leaves
LEARN_WEIGHT = 0.5  # how far one finished job moves the seconds-per-unit of its kind
TEACHER = "teacher"
STUDENT = "student"
DEFAULT_CAP = 2048  # tokens × policies a student may run when serving a room without --cap


class Refused(ValueError):
    """The room refuses a job (a second one of the same client, one over the cap); the message says why."""


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``22nd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(eq=False)
class Ticket:
    """One job in the line: whose it is (``client``), how big (``size``: tokens × policies) and of what
    ``kind`` (its speed is learnt apart), its Stop event, and when it joined, was last polled, started."""

    client: str
    size: int
    kind: str
    cancel: threading.Event
    joined: float
    seen: float
    started: float | None = None
    arrived: float = 0.0  # when its event reached the server (wall clock): the line's order
    left: float | None = None  # seconds its run said were left (report_progress), at ``reported``
    slowdown: float | None = None  # its run's recent time over its priced time (None: no pace yet)
    reported: float | None = None  # when its run last reported
    slowed: float = 0.0  # seconds run × the slowdown reported for them: their sum over ``paced`` is the
    paced: float = 0.0  # mean slowdown of the whole run, which its time is divided by to teach the line
    clock: Callable[[], float] = time.monotonic  # its line's clock


CURRENT: ContextVar[Ticket | None] = ContextVar("thinkviz_room_ticket", default=None)


class Line:
    """The model's line: tickets in arrival order; the first one runs (or is about to)."""

    def __init__(
        self, fallback: Callable[[], float | None] = lambda: None, clock: Callable[[], float] = time.monotonic
    ):
        self.fallback = fallback  # seconds per unit before any job was timed (the model's calibrated speed)
        self.clock = clock
        self._changed = threading.Condition()
        self._tickets: list[Ticket] = []
        self._rates: dict[str, float] = {}  # kind -> seconds per unit at the priced speed, learnt
        self._slowdown = 1.0  # the last slowdown a run reported: how busy the server was then

    def join(
        self, client: str, size: int, kind: str, cancel: threading.Event | None = None, arrived: float | None = None
    ) -> Ticket:
        """A new ticket, behind every job that arrived before it (``arrived``: when its event reached the
        server; default now: the end of the line); :class:`Refused` if ``client`` has one that is not
        stopping.  (Under load, handlers reach the line in a different order than their events reached
        the server: the arrival time keeps the line first come, first served.)"""
        with self._changed:
            self._drop_stale()
            mine = next((t for t in self._tickets if t.client == client and not t.cancel.is_set()), None)
            if mine is not None:
                doing = "is running" if mine.started is not None else f"is {self._place_text(mine)}"
                raise Refused(
                    f"One run at a time per person: your earlier run {doing}. "
                    "Wait for it to finish, or press Stop, then start this one."
                )
            now = self.clock()
            arrived = time.time() if arrived is None else arrived
            ticket = Ticket(client, max(1, int(size)), kind, cancel or threading.Event(), now, now, None, arrived)
            ticket.clock = self.clock  # report_progress stamps the run's reports on the line's clock
            place = len(self._tickets)
            while place > 1 and self._tickets[place - 1].started is None and self._tickets[place - 1].arrived > arrived:
                place -= 1  # (never ahead of the first: it has its turn)
            self._tickets.insert(place, ticket)
            self._changed.notify_all()
            return ticket

    def place(self, ticket: Ticket) -> int:
        """How many jobs are ahead of ``ticket`` (0: its turn)."""
        with self._changed:
            return self._tickets.index(ticket) if ticket in self._tickets else 0

    def wait_seconds(self, ticket: Ticket) -> float | None:
        """The estimated seconds until ``ticket``'s turn (``None``: a job ahead cannot be priced yet)."""
        with self._changed:
            return self._wait(ticket)

    def status(self, ticket: Ticket) -> str:
        """``"3rd in line — about 40 s"``: the ticket's place and estimated wait."""
        with self._changed:
            return self._place_text(ticket)

    def turn(self, ticket: Ticket, poll: float = POLL_SECONDS) -> Iterator[str]:
        """Wait for ``ticket``'s turn, yielding its status line whenever it changes (and at least every
        ``poll`` seconds, as the wait counts down); returns at its turn, or once it is stopped (it then
        leaves the line).  A job already first yields nothing."""
        first = True
        while True:
            with self._changed:
                if not first:
                    self._changed.wait(timeout=poll)
                first = False
                self._drop_stale(ticket)
                ticket.seen = self.clock()
                if ticket.cancel.is_set():
                    self._remove(ticket)
                    return
                if ticket not in self._tickets or self._tickets[0] is ticket:
                    return
                text = self._place_text(ticket)
            yield text

    def start(self, ticket: Ticket) -> None:
        """The ticket's job has the model now."""
        with self._changed:
            ticket.started = self.clock()

    def leave(self, ticket: Ticket, finished: bool = False) -> None:
        """The job is over (``finished``: it ran to its end, so its time, over the slowdown it ran
        under, teaches the line its kind's speed)."""
        with self._changed:
            if ticket.slowdown is not None:
                self._slowdown = ticket.slowdown
            if finished and ticket.started is not None:
                slowdown = ticket.slowed / ticket.paced if ticket.paced > 0 else ticket.slowdown or 1.0
                rate = (self.clock() - ticket.started) / ticket.size / slowdown
                old = self._rates.get(ticket.kind)
                self._rates[ticket.kind] = rate if old is None else old ** (1 - LEARN_WEIGHT) * rate**LEARN_WEIGHT
            self._remove(ticket)

    def __len__(self) -> int:
        with self._changed:
            return len(self._tickets)

    # ---- under the lock ------------------------------------------------------------------------
    def _remove(self, ticket: Ticket) -> None:
        if ticket in self._tickets:
            self._tickets.remove(ticket)
            self._changed.notify_all()

    def _drop_stale(self, keep: Ticket | None = None) -> None:
        """Waiting tickets nobody polled for :data:`STALE_SECONDS` (their client went) leave the line."""
        now = self.clock()
        for t in list(self._tickets):
            if t is not keep and t.started is None and now - t.seen > STALE_SECONDS:
                self._remove(t)

    def _rate(self, kind: str) -> float | None:
        """Seconds per unit for a job of ``kind`` now: the last finished jobs' (else the model's
        calibrated speed), slowed as the running job is (else as the last one reported was)."""
        rate = self._rates.get(kind)
        rate = self.fallback() if rate is None else rate
        if rate is None:
            return None
        running = (t.slowdown for t in self._tickets if t.started is not None and t.slowdown is not None)
        return rate * next(running, self._slowdown)

    def _estimate(self, ticket: Ticket) -> float | None:
        if ticket.started is not None and ticket.left is not None:
            return max(0.0, ticket.left - (self.clock() - ticket.reported))
        rate = self._rate(ticket.kind)
        if rate is None:
            return None
        seconds = rate * ticket.size
        if ticket.started is not None:
            seconds = max(0.0, seconds - (self.clock() - ticket.started))
        return seconds

    def _wait(self, ticket: Ticket) -> float | None:
        if ticket not in self._tickets:
            return 0.0
        ahead = [self._estimate(t) for t in self._tickets[: self._tickets.index(ticket)]]
        return None if any(s is None for s in ahead) else float(sum(ahead))

    def _place_text(self, ticket: Ticket) -> str:
        place = self._tickets.index(ticket) if ticket in self._tickets else 0
        wait = self._wait(ticket)
        when = format_seconds(wait) if wait is not None else "the wait shows once the model has been timed"
        return f"{ordinal(place)} in line — {when}"


@dataclass(frozen=True)
class Push:
    """A preset the teacher pushed to the room: ``number`` counts pushes, so each session opens it once."""

    number: int
    preset: str
    title: str


@dataclass
class Room:
    """Who may do what on this app, the model's :class:`Line`, and the last preset pushed to everyone.

    ``on=False`` (the default): everyone is the teacher, no cap.  ``on=True``: :attr:`teacher` is the
    teacher's login, everyone else is a student, whose runs may be at most :attr:`cap` tokens × policies
    (``None``: no cap)."""

    on: bool = False
    teacher: str = TEACHER
    cap: int | None = None
    line: Line = field(default_factory=Line)
    pushed: Push | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def role(self, user: str | None) -> str:
        return TEACHER if not self.on or user == self.teacher else STUDENT

    def is_teacher(self, user: str | None) -> bool:
        """Whether login ``user`` (``None``: nobody logged in) is the teacher here."""
        return self.role(user) == TEACHER

    def require_teacher(self, user: str | None, what: str) -> None:
        if not self.is_teacher(user):
            raise Refused(f"Only the teacher can {what} in this room.")

    def admit(self, size: int, kind: str, user: str | None, client: str, arrived: float | None = None) -> Ticket:
        """A ticket in the line for ``client``'s job of ``size`` tokens × policies (its event ``arrived``
        then); :class:`Refused` when a student's job is over the cap or the client already has one."""
        if self.on and self.cap is not None and size > self.cap and not self.is_teacher(user):
            raise Refused(
                f"This room caps a student's run at {self.cap:,} tokens × policies; this one is {size:,}. "
                "Make it smaller (fewer tokens or policies), or ask your teacher."
            )
        return self.line.join(client, size, kind, arrived=arrived)

    def set_cap(self, cap: float | None, user: str | None) -> str:
        """The teacher's new cap (``None`` or 0: none); returns the line that says it."""
        self.require_teacher(user, "set the cap")
        if cap is not None and (not math.isfinite(cap) or cap < 0):
            raise Refused(f"The cap is a number of tokens × policies, 0 or more, not {cap}.")
        self.cap = int(cap) if cap else None
        return self.cap_line()

    def cap_line(self) -> str:
        if self.cap is None:
            return "Students' runs: no cap."
        return f"Students' runs: at most {self.cap:,} tokens × policies each."

    def push(self, preset: str | None, title: str, user: str | None) -> Push:
        """The teacher asks every session to open ``preset``."""
        self.require_teacher(user, "push a preset to the room")
        if not preset:
            raise Refused("Pick a preset to push to the room.")
        with self._lock:
            number = self.pushed.number + 1 if self.pushed is not None else 1
            self.pushed = Push(number, preset, title)
            return self.pushed

    def news(self, seen: int) -> Push | None:
        """The push a session that has seen push number ``seen`` has not opened yet."""
        pushed = self.pushed
        return pushed if pushed is not None and pushed.number > seen else None


def report_progress(left: float, slowdown: float | None) -> None:
    """The running job of this thread's event (:data:`CURRENT`) has ``left`` seconds to go, by its own
    estimate, and runs ``slowdown`` times slower than priced (``None``: it has no pace yet)."""
    ticket = CURRENT.get()
    if ticket is None:
        return
    now = ticket.clock()
    if slowdown is not None:  # the time since the last report ran at this slowdown
        since = ticket.reported if ticket.reported is not None else ticket.started
        span = max(0.0, now - since) if since is not None else 0.0
        ticket.slowdown = float(slowdown)
        ticket.slowed, ticket.paced = ticket.slowed + span * slowdown, ticket.paced + span
    ticket.left, ticket.reported = max(0.0, float(left)), now


def run_size(request: Any, count_tokens: Callable[[str], int] | None = None) -> tuple[int, str]:
    """A request's size in tokens × policies and its kind (``"generate"``, ``"replay"``, ``"sweep"``).

    Live's and Compare's requests carry ``run_input`` and ``settings`` (and Compare's its ``columns``);
    a sweep's carries its ``trace``, ``policies``, ``budgets`` and ``vary``.  A replay's tokens are its
    ``max_tokens`` or the trace's, counted with ``count_tokens`` (else about four characters a token)."""
    count = count_tokens or (lambda text: max(1, len(text) // 4))
    if hasattr(request, "budgets"):  # a sweep: every policy (× its varied knob) at every budget
        runs = max(1, len(request.policies)) * max(1, len(request.budgets))
        runs *= math.prod(len(values) for values in request.vary.values()) if request.vary else 1
        tokens = request.max_trace_tokens or count(request.trace.text or "")
        return runs * tokens, "sweep"
    columns = len(getattr(request, "columns", None) or [None])
    run_input = request.run_input
    if run_input.replay:
        tokens = run_input.max_tokens or count(run_input.trace or "")
        return columns * tokens, "replay"
    return columns * request.settings.max_new_tokens, "generate"
