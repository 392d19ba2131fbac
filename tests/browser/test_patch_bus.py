"""The token-patch bus in a real browser, without the app: append, dedupe, gaps and resync."""

from __future__ import annotations

import threading

import pytest

from thinkviz.engine import DecodeSettings
from thinkviz.policies import make_policy
from thinkviz.ui.live import live_frames
from thinkviz.ui.runs import RunInput
from thinkviz.ui.stream import PATCH_BUS_JS, RESYNC_BUTTON_ID, TokenChannel, bus_payload, container_html
from thinkviz.ui.throttle import FramePacer
from thinkviz.viz.tokens import TOKEN_CSS
from tiny_models import tiny_model

pytestmark = pytest.mark.browser


@pytest.fixture
def bus_page(browser):
    page = browser.new_page()
    page.set_content(
        f"<style>{TOKEN_CSS}</style>{container_html('view')}"
        f"<button id='{RESYNC_BUTTON_ID}' onclick='window.resyncs=(window.resyncs||0)+1'></button>"
    )
    page.evaluate(f"window.bus = {PATCH_BUS_JS}")
    yield page
    page.close()


def send(page, message) -> None:
    page.evaluate("payload => window.bus(payload)", bus_payload(message))


def view(page) -> dict:
    return page.evaluate("""() => ({
        tokens: [...document.querySelectorAll('#view .tv-tok')].map(t => [t.dataset.pos, t.className, t.textContent]),
        resyncs: window.resyncs || 0})""")


@pytest.fixture(scope="module")
def frames():
    """A tiny-model Live run with evictions: one frame per token."""
    settings = DecodeSettings(max_new_tokens=20, stop_at_eos=False)
    run = live_frames(
        tiny_model("llama"),
        make_policy("h2o", budget=24, recent=4),
        RunInput("Think.", "Say <b>hi</b> & count."),
        settings,
        threading.Event(),
        TokenChannel("view", title_refresh=0.0),
        pacer=FramePacer(0.0),
    )
    return list(run)


def test_patches_build_the_same_view_as_the_final_reset(bus_page, frames):
    for frame in frames[:-1]:
        send(bus_page, frame.message)
    streamed = view(bus_page)
    send(bus_page, frames[-1].message)
    final = view(bus_page)
    assert streamed["tokens"] == final["tokens"] and len(final["tokens"]) == len(frames[-1].record.texts)
    assert any("tv-gone" in cls for _, cls, _ in final["tokens"])
    assert "<b>hi</b>" in "".join(text for *_, text in final["tokens"])  # shown as text, never as markup
    assert bus_page.locator("#view b").count() == 0
    assert final["resyncs"] == 0


def test_repeated_messages_are_ignored_and_a_gap_asks_for_a_reset(bus_page, frames):
    send(bus_page, frames[0].message)
    send(bus_page, frames[1].message)
    send(bus_page, frames[1].message)  # Gradio repeats the last value when a run ends
    count = len(view(bus_page)["tokens"])
    assert count == len(frames[1].view.texts)
    send(bus_page, frames[3].message)  # frame 2 was lost
    after_gap = view(bus_page)
    assert len(after_gap["tokens"]) == count and after_gap["resyncs"] == 1
    send(bus_page, frames[-1].message)  # a reset always applies
    assert len(view(bus_page)["tokens"]) == len(frames[-1].record.texts)


def test_each_payload_carries_enough_history_to_survive_merged_updates(bus_page, frames):
    from thinkviz.ui.stream import BACKLOG

    send(bus_page, frames[0].bus)
    for frame in frames[BACKLOG - 1 : -1 : BACKLOG - 1]:  # the page saw only every 7th payload
        send(bus_page, frame.bus)
    send(bus_page, frames[-2].bus)
    caught_up = view(bus_page)
    assert caught_up["resyncs"] == 0
    assert len(caught_up["tokens"]) == len(frames[-2].view.texts)


def test_a_longer_gap_than_the_history_asks_for_a_reset(bus_page, frames):
    from thinkviz.ui.stream import BACKLOG

    send(bus_page, frames[0].bus)
    send(bus_page, frames[BACKLOG + 2].bus)
    assert view(bus_page)["resyncs"] == 1
