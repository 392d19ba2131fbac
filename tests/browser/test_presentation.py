"""Presentation mode and following the newest token, as a class sees them at 1920×1080 (#11)."""

from __future__ import annotations

import math

import pytest

from test_ui_browser import MODEL_TIMEOUT, RUN_TIMEOUT, pick, set_number, wait_for_text

pytestmark = [pytest.mark.browser, pytest.mark.integration]

WIDTH, HEIGHT = 1920, 1080
AT_END_JS = """() => { const r = document.getElementById('tv-live-tokens');
  return r.scrollHeight > r.clientHeight && r.scrollHeight - r.scrollTop - r.clientHeight < 48; }"""

TOKEN_SIZE_JS = """() => { const view = document.createElement('div'); view.className = 'tv-view';
  document.getElementById('tv-live-tokens').appendChild(view);  // the size a run's tokens get
  const size = parseFloat(getComputedStyle(view).fontSize); view.remove(); return size; }"""


@pytest.fixture(scope="module")
def page(app_url, browser):
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT}, device_scale_factor=1)
    page = context.new_page()
    page.goto(app_url)
    wait_for_text(page, "#tv-model-status", "Model: Ready", MODEL_TIMEOUT)
    yield page
    context.close()


def _box(page, selector: str) -> dict:
    return page.locator(selector).first.bounding_box()


def test_presentation_mode_keeps_run_in_view_and_puts_tokens_beside_the_chart(page):
    page.click("#tv-present input")
    page.wait_for_function("!!document.querySelector('.tv-present')")
    run, stop = _box(page, "#tv-live-run"), _box(page, "#tv-live-stop")
    for button in (run, stop):
        assert 0 <= button["y"] and button["y"] + button["height"] <= HEIGHT
    assert page.is_visible("#tv-live-preset") and page.is_visible("#tv-live-policy")
    assert not page.is_visible("#tv-live-question")  # folded away
    tokens, chart = _box(page, "#tv-live-tokens"), _box(page, "#tv-live-memory")
    assert tokens["x"] + tokens["width"] <= chart["x"]  # side by side
    assert tokens["y"] < chart["y"] + chart["height"] and chart["y"] < tokens["y"] + tokens["height"]
    assert tokens["y"] < HEIGHT and chart["y"] < HEIGHT  # both start above the fold
    assert 18 <= page.evaluate(TOKEN_SIZE_JS) <= 20
    page.click("#tv-present input")
    page.wait_for_function("!document.querySelector('.tv-present')")
    assert page.is_visible("#tv-live-question")


def test_follow_keeps_the_newest_token_in_view_after_a_scroll_up_and_a_new_run(page):
    page.add_style_tag(content="#tv-live-tokens { max-height: 160px !important; overflow-y: auto; }")
    pick(page, "#tv-live-preset", "Live: a short word problem")
    page.wait_for_function(
        "document.querySelector('#tv-live-policy input').value === 'h2o' "
        "&& document.querySelector('#tv-live-question textarea').value.length > 0"
    )
    set_number(page, "#tv-live-max-new", 16)  # the prompt alone overflows 160 px
    page.click("#tv-live-run")
    wait_for_text(page, "#tv-live-status", r"^Done: ", RUN_TIMEOUT)
    page.wait_for_function(AT_END_JS)  # followed to the end while it streamed
    assert page.is_checked("#tv-live-follow input")
    page.hover("#tv-live-tokens")
    page.mouse.wheel(0, -2000)  # the reader scrolls up: following stops
    page.wait_for_function("!document.querySelector('#tv-live-follow input').checked")
    page.wait_for_function(f"!({AT_END_JS})()")  # the wheel's scroll lands after its event unticked following
    page.click("#tv-live-run")  # a new run follows again
    page.wait_for_function("document.querySelector('#tv-live-follow input').checked", timeout=RUN_TIMEOUT * 1000)
    wait_for_text(page, "#tv-live-status", r"^Done: ", RUN_TIMEOUT)
    page.wait_for_function(AT_END_JS)


def test_explore_opens_the_chosen_step_at_its_newest_token_under_its_legend(page):
    page.add_style_tag(content="#tv-explore-tokens .tv-container { max-height: 120px !important; }")  # a long view
    page.get_by_role("tab", name="Explore").click()  # opens the Live run of the test above
    page.wait_for_selector("#tv-explore-tokens .tv-tok")
    at_end = """() => { const box = document.querySelector('#tv-explore-tokens .tv-container');
      return box.scrollHeight > box.clientHeight && box.scrollHeight - box.scrollTop - box.clientHeight < 48; }"""
    page.wait_for_function(at_end)
    newest = page.evaluate("""() => { const box = document.querySelector('#tv-explore-tokens .tv-container');
      const toks = box.querySelectorAll('.tv-tok'), last = toks[toks.length - 1].getBoundingClientRect();
      const shown = box.getBoundingClientRect(); return last.top >= shown.top && last.bottom <= shown.bottom + 1; }""")
    assert newest  # the last token itself is in the box's view, not only the box's end
    legend = page.locator("#tv-explore-tokens .tv-legend")
    view = page.locator("#tv-explore-tokens").bounding_box()
    assert legend.is_visible() and legend.bounding_box()["y"] >= view["y"]  # the legend is not scrolled away


def test_the_budget_takes_exact_values_and_drags_on_a_log_scale(page):
    page.get_by_role("tab", name="Live").click()
    box, drag = "#tv-live-budget input[type=number]", "#tv-live-budget-drag input[type=range]"
    page.locator(drag).fill(f"{math.log2(160):.2f}")  # a drag to 2^7.32: the box shows 160, not 8 + k·step
    page.wait_for_function(f"document.querySelector('{box}').value === '160'")
    page.locator(box).fill("1000")  # any exact value typed; the drag follows on its log scale
    page.locator(box).press("Enter")
    page.wait_for_function(f"Math.abs(Number(document.querySelector('{drag}').value) - {math.log2(1000):.4f}) < 0.02")
    page.locator(drag).fill("3")  # the drag's low end is the budget's lowest value
    page.wait_for_function(f"document.querySelector('{box}').value === '8'")


FONT_SIZES_JS = """(selectors) => selectors.map((selector) => {
  const el = document.querySelector(selector); return el ? parseFloat(getComputedStyle(el).fontSize) : null; })"""
CHART_FITS_JS = """() => { const svg = document.querySelector('#tv-live-memory .main-svg');
  const panel = document.getElementById('tv-live-memory').getBoundingClientRect();
  const box = svg && svg.getBoundingClientRect();
  return Boolean(box) && box.width >= 0.9 * panel.width && box.left >= panel.left - 1 && box.right <= panel.right + 1;
}"""
# What a class reads after a run, and the least size each gets outside presentation mode (#34).
ROOM_SIZES = {
    "#tv-live-tokens .tv-tok": 15,
    "#tv-live-legend .tv-legend": 14,
    "#tv-live-stats .tv-stat span": 14,
    "#tv-live-stats .tv-stat b": 14,
    "#tv-live-memory .xtick text": 12,
    "#tv-live-memory .ytick text": 12,
}


def _sizes(page) -> dict[str, float]:
    return dict(zip(ROOM_SIZES, page.evaluate(FONT_SIZES_JS, list(ROOM_SIZES))))


def test_presentation_mode_after_a_run_fits_the_chart_keeps_the_notice_and_enlarges_the_text(page):
    page.get_by_role("tab", name="Live").click()
    pick(page, "#tv-live-preset", "Live: a short word problem, decoded under eviction")  # a short recording
    page.wait_for_function("!document.querySelector('#tv-live-play').disabled")
    pick(page, "#tv-live-speed", "as fast as it draws")
    page.click("#tv-live-play")
    wait_for_text(page, "#tv-live-status", r"^Done: ", RUN_TIMEOUT)
    notice = page.locator('[aria-label="preset notice"]').filter(has_text="Live: a short word problem")
    assert notice.count() == 1 and notice.first.is_visible()
    page.wait_for_function(CHART_FITS_JS)
    normal = _sizes(page)
    assert all(normal[selector] >= least for selector, least in ROOM_SIZES.items()), normal
    page.get_by_role("tab", name="Compare").click()  # a Compare column's tokens, before any comparison
    compare_size = page.evaluate(TOKEN_SIZE_JS.replace("tv-live-tokens", "tv-compare-tokens-0"))
    page.get_by_role("tab", name="Live").click()
    assert compare_size >= 15
    page.click("#tv-present input")  # after the run: the chart follows its narrower panel at once
    page.wait_for_function("!!document.querySelector('.tv-present')")
    page.wait_for_function(CHART_FITS_JS)
    assert notice.first.is_visible()
    box = notice.first.bounding_box()
    assert box["y"] + box["height"] <= HEIGHT / 3  # short: over the views, not instead of them
    large = _sizes(page)
    assert all(large[selector] > normal[selector] for selector in ROOM_SIZES), large  # larger still
    assert page.evaluate(FONT_SIZES_JS, ['[aria-label="preset notice"] p'])[0] >= 18
    page.click("#tv-present input")
    page.wait_for_function("!document.querySelector('.tv-present')")
    page.wait_for_function(CHART_FITS_JS)  # and back to the wide panel
    assert notice.first.is_visible()
