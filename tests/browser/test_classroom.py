"""What a class sees in Chromium: a preset's knobs in the sliders, the legend over each token view,
a token's details pinned by a click (no hover needed)."""

from __future__ import annotations

import pytest

from test_ui_browser import MODEL_TIMEOUT, pick, wait_for_text

pytestmark = [pytest.mark.browser, pytest.mark.integration]

SLIDER_VALUES_JS = """() => Object.fromEntries([...document.querySelectorAll('input[aria-label^="number input for "]')]
    .filter(e => e.offsetParent !== null)  // the Live tab's visible sliders
    .map(e => [e.getAttribute('aria-label').replace('number input for ', ''), Number(e.value)]))"""


@pytest.fixture(scope="module")
def page(app_url, browser):
    context = browser.new_context(viewport={"width": 1440, "height": 900}, device_scale_factor=1)
    page = context.new_page()
    page.goto(app_url)
    wait_for_text(page, "#tv-model-status", "Model: Ready", MODEL_TIMEOUT)
    yield page
    context.close()


def test_a_preset_for_another_policy_shows_its_own_knobs_in_the_sliders(page):
    assert page.input_value("#tv-live-policy input") == "h2o"
    pick(page, "#tv-live-preset", "Entropy: low-entropy anchors in a coding loop")
    page.wait_for_function(f"(() => {{ const v = ({SLIDER_VALUES_JS})(); "
                           "return v['max capacity tokens'] === 768 && v['Budget (tokens per layer and kv-head)'] === 1024; })()")
    values = page.evaluate(SLIDER_VALUES_JS)
    assert values["retention threshold"] == pytest.approx(0.3)
    assert page.input_value("#tv-live-policy input") == "entropy"
