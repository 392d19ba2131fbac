"""The token-patch bus in a real browser, without the app: append, dedupe, gaps and resync."""

from __future__ import annotations

import threading
from pathlib import Path

import plotly
import pytest

from thinkviz.core.engine import DecodeSettings
from thinkviz.policies import make_policy
from thinkviz.ui.live_run import live_frames
from thinkviz.measure.requests import RunInput
from thinkviz.ui.stream import (
    PATCH_BUS_JS,
    RESYNC_BUTTON_ID,
    TokenChannel,
    bus_payload,
    chart_frame,
    container_html,
)
from thinkviz.ui.throttle import FramePacer
from thinkviz.viz.tokens import TOKEN_CSS
from tiny_models import tiny_model

pytestmark = pytest.mark.browser
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


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
        figure_pacer=FramePacer(0.0),  # a chart in every frame, the first too
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


DRAWN_POINTS_JS = "() => document.querySelector('#shown [data-testid=plotly]')._fullData?.map(t => t.x.length)"


def test_a_chart_message_redraws_the_shown_chart_in_place(bus_page, frames):
    bus_page.add_script_tag(path=str(PLOTLY_JS))
    bus_page.evaluate("""() => {  // as gr.Plot leaves them: a chart shown, one on a hidden tab
        document.body.insertAdjacentHTML('beforeend', `<div id="shown"><div data-testid="plotly"></div></div>
            <div id="away" style="display: none"><div data-testid="plotly"></div></div>`);
        const chart = document.querySelector('#shown [data-testid=plotly]');
        chart.dataset.mark = 'placeholder';
        Plotly.newPlot(chart, [], {height: 260});
    }""")
    for frame in (frames[0], frames[-1]):  # the first and the last figure of the run, sent while it streams
        payload, plots = chart_frame(frame.bus, {"shown": frame.figure, "away": frame.figure}, False, "run")
        bus_page.evaluate("payload => window.bus(payload)", payload)
        points = len(frame.figure.data[1].x)
        bus_page.wait_for_function(f"({DRAWN_POINTS_JS})()?.[1] === {points}")
        assert plots == [None, None]
    assert bus_page.evaluate(DRAWN_POINTS_JS)[:2] == [len(frames[-1].record.events)] * 2  # full cache, KV cache
    chart = bus_page.locator("#shown [data-testid=plotly]")
    assert chart.get_attribute("data-mark") == "placeholder"  # the same chart, redrawn
    assert chart.locator(".scatterlayer .trace").count() >= 3
    assert bus_page.locator("#away .main-svg").count() == 0  # drawn when shown, by a later frame
    assert view(bus_page)["tokens"]  # the token patches of the same payloads applied


def test_a_chart_message_never_draws_over_a_chart_redrawn_meanwhile(bus_page, frames):
    bus_page.add_script_tag(path=str(PLOTLY_JS))
    bus_page.evaluate("""() => document.body.insertAdjacentHTML('beforeend',
        '<div id="shown"><div data-testid="plotly" class="old"></div></div>')""")
    payload, _ = chart_frame([], {"shown": frames[-1].figure}, False, "run")
    bus_page.evaluate(
        """payload => {  // gr.Plot draws the run's last figure into a new chart before the message's turn
            window.bus(payload);
            document.querySelector('#shown').innerHTML = '<div data-testid="plotly" class="new"></div>';
        }""",
        payload,
    )
    bus_page.wait_for_timeout(200)
    assert bus_page.locator("#shown .main-svg").count() == 0


OPACITY_JS = "() => document.querySelector('#shown [data-testid=plotly]').style.opacity"


def test_a_runs_first_frame_dims_the_last_runs_chart_until_a_figure_comes(bus_page, frames):
    bus_page.add_script_tag(path=str(PLOTLY_JS))
    bus_page.evaluate("""() => {
        document.body.insertAdjacentHTML('beforeend', '<div id="shown"><div data-testid="plotly"></div></div>');
        Plotly.newPlot(document.querySelector('#shown [data-testid=plotly]'), [{x: [1], y: [1]}], {height: 260});
    }""")
    payload, _ = chart_frame(frames[0].bus, {"shown": None}, False, "run", first=True)
    bus_page.evaluate("payload => window.bus(payload)", payload)
    assert bus_page.evaluate(OPACITY_JS) == "0.35"  # no redraw: the old chart, dimmed
    payload, _ = chart_frame(frames[1].bus, {"shown": frames[1].figure}, False, "run")
    bus_page.evaluate("payload => window.bus(payload)", payload)
    bus_page.wait_for_function(f"({OPACITY_JS})() === ''")  # this run's first figure: shown in full
    payload, _ = chart_frame(frames[0].bus, {"shown": None}, False, "run2", first=True)
    bus_page.evaluate("payload => window.bus(payload)", payload)
    assert bus_page.evaluate(OPACITY_JS) == "0.35"
    payload, _ = chart_frame(frames[-1].bus, {"shown": frames[-1].figure}, True, "run2")
    bus_page.evaluate("payload => window.bus(payload)", payload)
    assert bus_page.evaluate(OPACITY_JS) == ""  # the last frame undims whatever gr.Plot draws
