"""A room on one served app, through its API (gradio_client, 127.0.0.1 only): playback beside a run that
holds the model, the model's line in arrival order with each client's place, one job per client, the
cap on a student's run, the login, and the teacher's preset reaching another session.

The app is built in this process around a tiny random model; a run "holds the model" with a policy
that waits, inside the real engine, until the test lets it go (no timing decides anything here).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable

import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError

from thinkviz.demos.presets import load_preset
from thinkviz.policies.base import Policy
from thinkviz.ui.room import SWITCH_INTERVAL, Room
from tiny_app import served_demo

pytestmark = pytest.mark.browser

TIMEOUT = 120.0  # seconds for anything to happen on a busy 2-core machine
PRESET = "math_h2o_vs_window"  # a committed recording (played with no model)
GATE = threading.Event()  # the holding policy's runs wait for it
ENTERED = threading.Event()  # set once a holding run has reached the policy


class HoldingPolicy(Policy):
    """Keeps the newest tokens, after waiting for the test's :data:`GATE` at its first compression."""

    name = "holding"
    summary = "waits for the test, then keeps the newest tokens"

    def score(self, view):
        ENTERED.set()
        GATE.wait(TIMEOUT)
        return torch.zeros_like(view.received)


def generate(budget: int = 64, tokens: int = 4, policy: str = "h2o") -> dict:
    """/generate's arguments by name: a short generation with interval 1 (a compression each token)."""
    return {
        "run_mode": "generate",
        "question": "What is 2 + 3?",
        "policy": policy,
        "budget": budget,
        "interval": 1,
        "max_new_tokens": tokens,
        "stop_at_eos": False,
    }


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def statuses(job) -> list[str]:
    return [str(frame[0]) for frame in job.outputs()]


@pytest.fixture(scope="module")
def open_app():
    with served_demo(HoldingPolicy) as demo:
        yield demo.local_url


@pytest.fixture
def hold():
    """Runs of the holding policy wait until the test ends (or calls ``release``)."""
    GATE.clear(), ENTERED.clear()
    yield GATE.set
    GATE.set()


def test_a_recording_plays_while_a_run_holds_the_model_and_the_line_keeps_arrival_order(open_app, hold):
    holder, first, second, player = (Client(open_app, verbose=False) for _ in range(4))
    held = holder.submit(**generate(policy="holding", budget=8), api_name="/generate")
    until(ENTERED.is_set, "the holding run to reach its policy")
    one = first.submit(**generate(), api_name="/generate")
    until(lambda: any("1st in line" in s for s in statuses(one)), "the first waiting run's place")
    two = second.submit(**generate(), api_name="/generate")
    until(lambda: any("2nd in line" in s for s in statuses(two)), "the second waiting run's place")
    # the model is held and two runs wait: a recording still plays to its end
    played = player.submit(preset=PRESET, speed="as fast as it draws", api_name="/play").result(timeout=TIMEOUT)
    assert "(played to the end)" in str(played[0]), played[0]
    assert not held.done() and not one.done() and not two.done()
    hold()
    until(lambda: two.done(), "the waiting runs to finish")
    assert str(held.result()[0]).startswith("Done: 4 tokens")
    assert str(one.result()[0]).startswith("Done: 4 tokens") and str(two.result()[0]).startswith("Done: 4 tokens")
    # arrival order: the second waiting run moved up to first in line once the first one took the model
    assert any("1st in line" in s for s in statuses(two))
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)  # the served app's threads take turns often


def test_a_second_run_of_the_same_client_is_refused_while_its_first_waits(open_app, hold):
    holder, student = Client(open_app, verbose=False), Client(open_app, verbose=False)
    held = holder.submit(**generate(policy="holding", budget=8), api_name="/generate")
    until(ENTERED.is_set, "the holding run to reach its policy")
    waiting = student.submit(**generate(), api_name="/generate")
    until(lambda: any("in line" in s for s in statuses(waiting)), "the student's run to be in line")
    with pytest.raises(AppError, match="One run at a time per person: your earlier run is 1st in line"):
        student.predict(**generate(tokens=3), api_name="/generate")
    hold()
    assert str(waiting.result()[0]).startswith("Done: 4 tokens")
    assert str(held.result()[0]).startswith("Done: 4 tokens")
    # once it is over, the same client may run again
    assert str(student.predict(**generate(tokens=3), api_name="/generate")[0]).startswith("Done: 3 tokens")


LOGINS = [("miss-t", "chalk-1"), ("ada", "pencil-2")]


@pytest.fixture(scope="module")
def room_app():
    with served_demo(auth=LOGINS, room=Room(on=True, teacher="miss-t", cap=40)) as demo:
        yield demo.local_url


def test_serving_with_logins_refuses_a_client_without_one(room_app):
    from gradio_client.exceptions import AuthenticationError

    with pytest.raises(AuthenticationError, match="credentials were not provided"):
        Client(room_app, verbose=False)
    with pytest.raises(ValueError, match="Could not login"):
        Client(room_app, verbose=False, auth=("ada", "wrong"))
    assert Client(room_app, verbose=False, auth=LOGINS[1]).predict(api_name="/room_news") is not None


def test_a_students_run_over_the_cap_is_refused_naming_the_cap_and_the_teachers_is_not(room_app):
    student = Client(room_app, verbose=False, auth=LOGINS[1])
    with pytest.raises(AppError, match="This room caps a student's run at 40 tokens × policies; this one is 48"):
        student.predict(**generate(tokens=48), api_name="/generate")
    assert str(student.predict(**generate(tokens=8), api_name="/generate")[0]).startswith("Done: 8 tokens")
    teacher = Client(room_app, verbose=False, auth=LOGINS[0])
    assert str(teacher.predict(**generate(tokens=48), api_name="/generate")[0]).startswith("Done: 48 tokens")
    with pytest.raises(AppError, match="Only the teacher can set the cap"):
        student.predict(1000, api_name="/set_room_cap")


def test_the_teachers_preset_push_opens_it_in_another_session(room_app):
    teacher = Client(room_app, verbose=False, auth=LOGINS[0])
    student = Client(room_app, verbose=False, auth=LOGINS[1])
    preset, line = student.predict(api_name="/room_news")
    assert "opened" not in str(line)  # nothing pushed yet
    with pytest.raises(AppError, match="Only the teacher can push a preset"):
        student.predict(PRESET, api_name="/push_preset")
    said = teacher.predict(PRESET, api_name="/push_preset")
    assert "Pushed to everyone" in str(said)
    preset, line = student.predict(api_name="/room_news")
    assert preset == PRESET and "Your teacher opened" in line and "you are a student" in line
    again, line = student.predict(api_name="/room_news")
    assert "Your teacher opened" not in str(line)  # each push opens once per session


@pytest.mark.integration  # the browser tier's marker set: Chromium drives the page (no embedded model here)
def test_in_chromium_a_student_logs_in_and_the_teachers_push_opens_the_preset(room_app, browser):
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    try:
        page.goto(room_app)
        page.fill("input[type=text]", LOGINS[1][0])
        page.fill("input[type=password]", LOGINS[1][1])
        page.keyboard.press("Enter")
        page.wait_for_selector("#tv-room-line", timeout=TIMEOUT * 1000)
        page.wait_for_function(
            "document.querySelector('#tv-room-line').textContent.includes('you are a student')", timeout=TIMEOUT * 1000
        )
        assert not page.locator("#tv-room-teacher").is_visible()  # the teacher's panel is the teacher's
        teacher = Client(room_app, verbose=False, auth=LOGINS[0])
        teacher.predict("generate_muffins", api_name="/push_preset")
        # a page opened after an earlier push (this module's other tests) opens that one first: wait for
        # this push by its title, in the room line and in the Live tab's preset picker
        title = json.dumps(load_preset("generate_muffins").title)
        page.wait_for_function(
            f"document.querySelector('#tv-room-line').textContent.includes('Your teacher opened ' + {title})",
            timeout=TIMEOUT * 1000,
        )
        page.wait_for_function(f"document.querySelector('#tv-live-preset input').value === {title}")
    finally:
        context.close()
