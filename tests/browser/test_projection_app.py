"""The memory chart of a played recording, in Chromium: what the projection says about h2o (#34)."""

from __future__ import annotations

import re

import pytest

from test_ui_browser import MODEL_TIMEOUT, RUN_TIMEOUT, pick, wait_for_text

pytestmark = [pytest.mark.browser, pytest.mark.integration]

TEXTS_JS = """(sel) => [...document.querySelectorAll(`#tv-live-memory ${sel}`)].map(e => e.textContent)"""


@pytest.fixture(scope="module")
def page(app_url, browser):
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
    page = context.new_page()
    page.goto(app_url)
    wait_for_text(page, "#tv-model-status", "Model: ", MODEL_TIMEOUT)  # a recording plays without the model
    yield page
    context.close()


def test_a_played_h2o_recording_is_projected_at_its_cap_and_never_said_to_grow(page):
    pick(page, "#tv-live-preset", "Live: a short word problem, decoded under eviction")  # h2o, budget 160
    page.wait_for_function("() => !document.querySelector('#tv-live-play').disabled", timeout=60_000)
    pick(page, "#tv-live-speed", "as fast as it draws")
    page.click("#tv-live-play")
    wait_for_text(page, "#tv-live-status", "Done", RUN_TIMEOUT)
    page.wait_for_function("() => document.querySelectorAll('#tv-live-memory .annotation-text').length > 0")
    notes = page.evaluate(TEXTS_JS, ".annotation-text")
    legend = page.evaluate(TEXTS_JS, ".legendtext")
    about_h2o = [n for n in notes if n.startswith("h2o")]
    assert about_h2o and all(not re.search(r"grow|run(s)? out", n) for n in about_h2o), notes
    # budget 160 + interval 8, the 116 protected and 32 recent tokens within the budget
    assert about_h2o[0].startswith("h2o holds at most 168 tokens (budget 160, + 8 read between compressions)")
    assert not any("grow" in name and "policy" in name for name in legend), legend
    assert any(name.startswith("peak KV ") for name in legend), legend
