"""What a class sees in Chromium: a preset's knobs in the sliders, the legend over each token view,
a token's details pinned by a click (no hover needed)."""

from __future__ import annotations

import pytest

from test_ui_browser import MODEL_TIMEOUT, RUN_TIMEOUT, pick, set_number, wait_for_text

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
    page.wait_for_function(
        f"(() => {{ const v = ({SLIDER_VALUES_JS})(); return v['max capacity tokens'] === 768 "
        "&& Number(document.querySelector('#tv-live-budget input').value) === 1024; })()"
    )  # the budget is a number box over a log-scale drag (#11), no longer a slider with its own number input
    values = page.evaluate(SLIDER_VALUES_JS)
    assert values["retention threshold"] == pytest.approx(0.3)
    assert page.input_value("#tv-live-policy input") == "entropy"


def test_the_legend_follows_the_view_mode_and_a_click_pins_a_tokens_details(page):
    pick(page, "#tv-live-preset", "Live: a short word problem")
    page.wait_for_function("document.querySelector('#tv-live-policy input').value === 'h2o'")
    set_number(page, "#tv-live-max-new", 4)
    page.click("#tv-live-run")
    wait_for_text(page, "#tv-live-status", r"^Done: 4 tokens", RUN_TIMEOUT)
    legend = page.locator("#tv-live-legend .tv-legend")
    assert legend.get_attribute("aria-label") == "Legend: combined view of h2o"
    assert legend.is_visible()
    assert "rarely attended" in legend.inner_text() and "evicted everywhere" in legend.inner_text()
    page.click("#tv-live-mode label:has-text('segments')")
    page.wait_for_selector('#tv-live-legend [aria-label="Legend: segments view of h2o"]')
    assert "Heat" not in legend.inner_text() and "question" in legend.inner_text()
    # no hover: a click event alone pins the token's details above the view
    token = page.locator('#tv-live-tokens .tv-tok[data-pos="5"]')
    token.dispatch_event("click")
    live_pin = "document.getElementById('tv-live-tokens').closest('.tv-pin-host').querySelector('.tv-pin').textContent"
    page.wait_for_function(f"{live_pin}.includes('pos 5')")
    pin = page.evaluate(live_pin)
    assert "pos 5" in pin and "system" in pin and "kept" in pin
    assert "tv-pinned" in token.get_attribute("class")
    page.click("#tv-live-mode label:has-text('combined')")  # the view is re-rendered: the pin stays
    page.wait_for_selector('#tv-live-tokens .tv-mode-combined .tv-tok.tv-pinned[data-pos="5"]')
    token.dispatch_event("click")  # a second click unpins
    page.wait_for_function("!document.querySelector('#tv-live-tokens .tv-pinned')")


def test_explore_says_clearly_when_a_step_is_past_the_last(page):
    page.get_by_role("tab", name="Explore").click()  # opens the Live run of the test above
    wait_for_text(page, "#tv-explore-caption", r"Step \*?\*?3\*?\*? of 3", 60)
    assert page.locator("#tv-explore-tokens .tv-legend").count() == 1
    set_number(page, "#tv-explore-step", 99)
    toast = page.locator(".toast-body.error")
    toast.first.wait_for(timeout=30_000)
    assert "step 99 is outside this run: its steps go from 0 to 3" in toast.first.inner_text()
