"""The room's rules without a server: the model's line (places, estimates, one job per client, arrival
order), the cap and the teacher's rights, a request's size, app.py's room flags, the crowd's frame
spacing, and a recording decoded once however many ask for it at once."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import gradio as gr
import pytest

import app
from thinkviz.bench.room_load import shown_wait
from thinkviz.demos import record
from thinkviz.demos.shared import SharedBuilds
from thinkviz.ui import throttle
from thinkviz.ui.app import queue_for_a_room
from thinkviz.ui.room import (
    QUEUE_POLLS,
    CURRENT,
    STALE_SECONDS,
    Line,
    Refused,
    Room,
    ordinal,
    report_progress,
    run_size,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st", "111th",
    ]  # fmt: skip


def test_the_line_shows_each_place_and_a_wait_priced_by_the_model_until_it_learns_its_own():
    clock = Clock()
    line = Line(fallback=lambda: 0.1, clock=clock)  # the calibrated speed: 0.1 s a token
    running, second, third = (line.join(name, 100, "replay") for name in ("a", "b", "c"))
    line.start(running)
    assert [line.place(t) for t in (running, second, third)] == [0, 1, 2]
    assert line.status(second) == "1st in line — about 10 s"
    assert line.status(third) == "2nd in line — about 20 s"
    clock.now = 4.0  # the running job is 4 s in: 6 s left of it
    assert line.wait_seconds(third) == pytest.approx(16.0)
    clock.now = 40.0  # it took 40 s for 100 tokens: 0.4 s a token, learnt (halfway, geometrically)
    line.leave(running, finished=True)
    assert line.place(second) == 0 and line.place(third) == 1
    assert line.wait_seconds(third) == pytest.approx(100 * 0.4)  # a first measurement replaces the fallback


def test_without_any_speed_the_place_shows_and_the_wait_says_why_it_is_missing():
    line = Line()
    line.join("a", 10, "generate")
    waiting = line.join("b", 10, "generate")
    assert line.status(waiting) == "1st in line — the wait shows once the model has been timed"


def test_one_job_per_client_a_stopped_one_does_not_count():
    line = Line()
    first = line.join("a", 10, "generate")
    line.join("b", 10, "generate")
    line.start(first)
    with pytest.raises(Refused, match="One run at a time per person: your earlier run is running"):
        line.join("a", 10, "generate")
    first.cancel.set()  # Stop: the next run of the same client may queue behind it
    assert line.place(line.join("a", 10, "generate")) == 2


def test_turn_waits_in_arrival_order_and_a_stop_leaves_the_line():
    line = Line(fallback=lambda: 0.0)
    first, second, third = (line.join(name, 1, "generate") for name in "abc")
    assert list(line.turn(first)) == []  # first in line: no wait at all
    shown: list[str] = []
    third_waits = line.turn(third, poll=0.01)
    shown.append(next(third_waits))
    assert shown == ["2nd in line — under 5 s"]
    line.leave(first, finished=True)
    assert next(third_waits) == "1st in line — under 5 s"  # the line moved
    third.cancel.set()  # Stop while waiting
    assert list(third_waits) == [] and len(line) == 1
    assert list(line.turn(second)) == []


def test_a_waiting_job_nobody_polls_any_more_leaves_the_line():
    clock = Clock()
    line = Line(clock=clock)
    running, gone = line.join("a", 1, "generate"), line.join("b", 1, "generate")
    line.start(running)
    clock.now = STALE_SECONDS + 1
    late = line.join("c", 1, "generate")
    assert gone not in line._tickets and line.place(late) == 1


def test_a_students_run_over_the_cap_is_refused_naming_it_the_room_off_has_no_cap():
    room = Room(on=True, teacher="miss-t", cap=1000)
    with pytest.raises(Refused, match="This room caps a student's run at 1,000 tokens × policies; this one is 1,200"):
        room.admit(1200, "generate", "ada", "tab-1")
    assert room.line.place(room.admit(1000, "generate", "ada", "tab-1")) == 0
    assert room.admit(5000, "generate", "miss-t", "tab-2") is not None  # the teacher's is not capped
    assert Room().admit(10**6, "generate", None, "tab-3") is not None  # loopback: no cap, everyone is the teacher


def test_only_the_teacher_sets_the_cap_or_pushes_and_each_push_is_news_once():
    room = Room(on=True, teacher="miss-t")
    for student in ("ada", None):  # a student, or nobody logged in
        with pytest.raises(Refused, match="Only the teacher can push a preset to the room"):
            room.push("math_h2o_vs_window", "Math", student)
        with pytest.raises(Refused, match="Only the teacher can set the cap"):
            room.set_cap(10, student)
    assert room.set_cap(500, "miss-t") == "Students' runs: at most 500 tokens × policies each."
    assert Room().set_cap(0, None) == "Students' runs: no cap."  # off: everyone may
    with pytest.raises(Refused, match="Pick a preset"):
        room.push(None, "", "miss-t")
    assert room.news(0) is None
    pushed = room.push("math_h2o_vs_window", "Math", "miss-t")
    assert room.news(0) == pushed and room.news(pushed.number) is None
    assert room.push("tam_math", "TAM", "miss-t").number == 2


def test_a_requests_size_is_tokens_times_policies():
    settings = SimpleNamespace(max_new_tokens=300)
    generate = SimpleNamespace(run_input=SimpleNamespace(replay=False), settings=settings)
    assert run_size(generate) == (300, "generate")
    columns = [None] * 6
    compare = SimpleNamespace(columns=columns, run_input=SimpleNamespace(replay=False), settings=settings)
    assert run_size(compare) == (1800, "generate")
    replay = SimpleNamespace(run_input=SimpleNamespace(replay=True, max_tokens=None, trace="one two three"))
    assert run_size(replay, count_tokens=lambda text: len(text.split())) == (3, "replay")
    cut = SimpleNamespace(run_input=SimpleNamespace(replay=True, max_tokens=64, trace="x" * 10_000))
    assert run_size(cut) == (64, "replay")
    sweep = SimpleNamespace(
        policies=["h2o", "tova"], budgets=[1, 2, 3], vary={"k": ["a", "b"]}, max_trace_tokens=100, trace=None
    )
    assert run_size(sweep) == (2 * 3 * 2 * 100, "sweep")


def test_app_without_room_flags_serves_loopback_without_a_login():
    args = app.parse_args([])
    served = app.serving(args)
    assert args.host == "127.0.0.1" and served.auth == [] and served.notice == "" and not served.room.on


def test_app_room_serves_the_network_with_generated_passwords_printed():
    args = app.parse_args(["--room", "--cap", "512"])
    served = app.serving(args)
    assert args.host == "0.0.0.0" and served.room.on and served.room.cap == 512
    (teacher, t_pass), (student, s_pass) = served.auth
    assert (teacher, student) == ("teacher", "student") and len(t_pass) >= 12 and len(s_pass) >= 8
    assert t_pass in served.notice and s_pass in served.notice and "at most 512 tokens × policies" in served.notice
    assert app.serving(app.parse_args(["--room"])).auth[0][1] != t_pass  # a new password each start


def test_app_auth_flags():
    served = app.serving(app.parse_args(["--auth", "ann:pw1", "--auth", "bo:pw2"]))
    assert served.auth == [("ann", "pw1"), ("bo", "pw2")] and not served.room.on  # a login, no room
    room = app.serving(app.parse_args(["--room", "--auth", "ann:pw1", "--teacher", "ann", "--cap", "0"])).room
    assert room.on and room.teacher == "ann" and room.cap is None
    for bad in (["--auth", "nopassword"], ["--room", "--auth", "ann:pw", "--teacher", "zed"], ["--cap", "-1"]):
        with pytest.raises(SystemExit):
            app.parse_args(bad)


def test_a_crowd_of_streams_spaces_every_pacers_frames():
    clock = Clock()
    pacer = throttle.FramePacer(0.1, clock)
    assert pacer.due()
    clock.now = 0.15
    assert pacer.due()  # no crowd: every 0.1 s
    with throttle.streaming(), throttle.streaming(), throttle.streaming():
        crowd = [throttle.streaming() for _ in range(5)]
        for stream in crowd:
            stream.__enter__()
        assert throttle.crowd_spread() == 2.0  # 8 streams, 4 at full rate
        clock.now = 0.3
        assert not pacer.due()  # 0.15 s since the last: under 0.2
        clock.now = 0.36
        assert pacer.due()
        for stream in crowd:
            stream.__exit__(None, None, None)
    assert throttle.crowd_spread() == 1.0


def test_the_bench_reads_the_lines_wording():
    line = Line(fallback=lambda: 1.0)
    line.join("a", 130, "generate")
    waiting = line.join("b", 1, "generate")
    assert shown_wait(line.status(waiting)) == (1, 130.0)  # "about 2 min 10 s"
    assert shown_wait("3rd in line — about 40 s") == (3, 40.0)
    assert shown_wait("2nd in line — under 5 s") == (2, 2.5)
    assert shown_wait("Replaying: 12 of 40 tokens") == (0, None)


def test_a_recording_is_decoded_once_however_many_ask_at_once(monkeypatch):
    decoded, gate = [], threading.Event()
    real_load = record.load

    def slow_load(path):
        decoded.append(path)
        gate.wait(10)
        return real_load(path)

    monkeypatch.setattr(record, "load", slow_load)
    monkeypatch.setattr(record, "_RECORDINGS", SharedBuilds(record.CACHED_RECORDINGS))
    threads = [threading.Thread(target=record.load_preset_recording, args=("generate_muffins",)) for _ in range(8)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 0.5  # long enough for every thread to ask while the first decodes
    while len(decoded) < len(threads) and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    for thread in threads:
        thread.join()
    assert len(decoded) == 1


def test_the_line_keeps_arrival_order_when_handlers_reach_it_late():
    line = Line(fallback=lambda: 1.0)
    running = line.join("a", 10, "replay", arrived=100.0)
    line.start(running)
    late = line.join("c", 10, "replay", arrived=102.0)
    early = line.join("b", 10, "replay", arrived=101.0)  # its event came first; its handler ran second
    assert [line.place(t) for t in (running, early, late)] == [0, 1, 2]


def test_a_running_jobs_reported_progress_prices_the_line():
    clock = Clock()
    line = Line(fallback=lambda: 0.01, clock=clock)  # the idle machine's speed: 1 s for 100 tokens
    running, waiting = line.join("a", 100, "replay"), line.join("b", 100, "replay")
    line.start(running)
    clock.now = 10.0
    token = CURRENT.set(running)
    report_progress(30.0, 40.0)  # its run: 30 s left, 40 times slower than priced (the server is busy)
    CURRENT.reset(token)
    assert line.wait_seconds(waiting) == pytest.approx(30.0)  # 30 s left of it
    assert line.status(line.join("c", 100, "replay")) == "2nd in line — about 1 min 10 s"  # + 40 s at its pace
    clock.now = 20.0
    assert line.wait_seconds(waiting) == pytest.approx(20.0)  # counting down from what it said


def test_a_finished_jobs_slowdown_prices_the_next_jobs_until_the_running_one_reports_its_own():
    clock = Clock()
    line = Line(fallback=lambda: 0.01, clock=clock)  # the idle machine's speed: 1 s for 100 tokens
    first = line.join("a", 100, "replay")
    line.start(first)
    token = CURRENT.set(first)
    report_progress(30.0, 4.0)  # four times slower than priced
    CURRENT.reset(token)
    clock.now = 4.0  # it took 4 s: 0.04 s a token under a slowdown of 4, 0.01 at the priced speed
    line.leave(first, finished=True)
    second, third = line.join("b", 100, "replay"), line.join("c", 100, "replay")
    line.start(second)
    assert line.wait_seconds(third) == pytest.approx(4.0)  # still as busy as the last run found it
    token = CURRENT.set(second)
    report_progress(1.0, 1.0)  # the load is gone: as priced
    CURRENT.reset(token)
    assert line.wait_seconds(line.join("d", 100, "replay")) == pytest.approx(1.0 + 1.0)


def test_a_finished_job_teaches_the_line_its_speed_over_the_slowdown_of_its_whole_run():
    """A run slowed 10× for 9 s by a burst of load, then as priced for its last second, teaches the line
    its kind's speed over the mean slowdown it ran under (9.1), not over the last one (1)."""
    clock = Clock()
    line = Line(fallback=lambda: 0.01, clock=clock)
    first = line.join("a", 100, "replay")
    line.start(first)
    token = CURRENT.set(first)
    clock.now = 9.0
    report_progress(1.0, 10.0)
    clock.now = 10.0
    report_progress(0.0, 1.0)
    CURRENT.reset(token)
    line.leave(first, finished=True)
    second, third = line.join("b", 100, "replay"), line.join("c", 100, "replay")
    line.start(second)
    assert line.wait_seconds(third) == pytest.approx(10.0 / 100 / 9.1 * 100 * 1.0)  # at the last slowdown, 1


def test_the_apps_queue_looks_for_work_at_the_rooms_pace_not_gradios_every_millisecond():
    """Gradio's idle queue polls every millisecond (7.5 % of a core with no page open); the app's waits
    longer.  The attributes are Gradio's own: a Gradio that renamed them fails here, not silently."""
    gradios = gr.Blocks().queue()._queue
    assert all(hasattr(gradios, name) for name in QUEUE_POLLS)
    assert gradios.sleep_when_free < QUEUE_POLLS["sleep_when_free"]
    ours = queue_for_a_room(gr.Blocks())._queue
    assert {name: getattr(ours, name) for name in QUEUE_POLLS} == QUEUE_POLLS
