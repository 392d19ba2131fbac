"""A lesson in Chromium (#39): a link opens it, Next and the arrow key step it, ``&step=N`` opens step N.

The lessons draw from the committed preset recordings, so the app around a tiny random model serves
them as the real app does (no model is used).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from tiny_app import served_app

from thinkviz.demos.lessons import built_steps, load_lesson

pytestmark = pytest.mark.browser

LESSON = "kv_cache_basics"
NARRATION = '[aria-label="lesson narration"]'
TIMEOUT = 60_000


@pytest.fixture(scope="module")
def url():
    with served_app() as address:
        yield address


@pytest.fixture(scope="module")
def context(browser):
    context = browser.new_context(viewport={"width": 1440, "height": 900}, device_scale_factor=1)
    yield context
    context.close()


@pytest.fixture(scope="module")
def narrations() -> list[str]:
    return [step.narration for step in built_steps(load_lesson(LESSON))]


def _at(page, number: int, narrations: list[str]) -> None:
    """Wait until the page shows step ``number`` (1-based): its indicator and its narration."""
    total = len(narrations)
    page.wait_for_function(
        "([n, text]) => { const s = document.querySelector('#tv-lesson-step'); "
        "const t = document.querySelector('[aria-label=\"lesson narration\"]'); "
        "return s && s.textContent.trim() === n && t && t.textContent.trim() === text; }",
        arg=[f"{number} / {total}", narrations[number - 1]],
        timeout=TIMEOUT,
    )


# What the one view shows: the token view's HTML (its size and marks), or the chart's SVG text.
VIEW_JS = (
    "() => { const t = document.querySelector('#tv-lesson-tokens');"
    " const c = document.querySelector('#tv-lesson-chart');"
    " const shown = (e) => e && e.offsetParent !== null;"
    " return (shown(t) ? 'tokens:' + t.innerHTML.length + ':' + t.querySelectorAll('.tv-mark').length : '')"
    " + (shown(c) ? 'chart:' + [...c.querySelectorAll('.main-svg')].map((e) => e.textContent).join(' ') : ''); }"
)
CHART_DRAWN = "() => !!document.querySelector('#tv-lesson-chart .main-svg')"


def _view(page) -> str:
    return page.evaluate(VIEW_JS)


def test_a_link_opens_the_lesson_and_next_and_the_arrow_key_step_it(context, url, narrations):
    page = context.new_page()
    page.goto(f"{url}?lesson={LESSON}")
    _at(page, 1, narrations)
    assert page.get_by_role("tab", name="Lessons").get_attribute("aria-selected") == "true"
    assert page.locator(NARRATION).is_visible()
    assert page.locator("#tv-lesson-tokens .tv-mark").count() > 0  # step 1 outlines the question
    views = [_view(page)]
    page.get_by_role("button", name="Next", exact=True).click()
    _at(page, 2, narrations)
    page.wait_for_function(CHART_DRAWN, timeout=TIMEOUT)
    views.append(_view(page))
    page.keyboard.press("ArrowRight")  # the focus is on Next, a button: the key steps the lesson
    _at(page, 3, narrations)
    page.wait_for_function(f"(before) => ({CHART_DRAWN})() && ({VIEW_JS})() !== before", arg=views[-1])
    views.append(_view(page))
    assert views[0].startswith("tokens:") and views[1].startswith("chart:") and views[2].startswith("chart:")
    assert len(set(views)) == 3  # each step its own view
    page.keyboard.press("ArrowLeft")
    _at(page, 2, narrations)
    page.get_by_role("button", name="Back", exact=True).click()
    _at(page, 1, narrations)
    page.locator("body").click(position={"x": 5, "y": 5})  # nothing focused: the arrow keys still step
    page.keyboard.press("ArrowRight")
    _at(page, 2, narrations)
    page.close()


def test_a_link_with_a_step_opens_that_step(context, url, narrations):
    page = context.new_page()
    page.goto(f"{url}?lesson={LESSON}&step=3")
    _at(page, 3, narrations)  # step 3: the full cache priced on a card, at the token it runs out of memory
    page.wait_for_function(CHART_DRAWN, timeout=TIMEOUT)
    assert "Projected on Qwen3-4B" in _view(page)
    for step in (4, 5):  # Next pressed as soon as a step shows: the tab opening draws nothing over it
        page.get_by_role("button", name="Next", exact=True).click()
        _at(page, step, narrations)
    page.close()


def test_a_link_to_an_unknown_lesson_says_so(context, url):
    page = context.new_page()
    page.goto(f"{url}?lesson=no_such_lesson")
    page.wait_for_function(
        "() => (document.querySelector('[aria-label=\"lesson narration\"]')?.textContent || '')"
        ".includes(\"unknown lesson 'no_such_lesson'\")",
        timeout=TIMEOUT,
    )
    page.close()


def test_bench_browser_lesson_times_a_link_and_every_step(url):
    """``bench browser --lesson`` against the served app, in a process of its own (Playwright's sync API
    refuses a thread where the browser fixture runs); its numbers stay in its output."""
    steps = len(load_lesson(LESSON).steps)
    done = subprocess.run(
        [sys.executable, "-m", "thinkviz", "bench", "browser", "--lesson", LESSON, "--links", "1", "--url", url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Lessons tab, {LESSON} ({steps} steps, no model needed)" in done.stdout
    for label in ("Next", "Back"):
        assert re.search(rf"{label} -> step shown:  median [\d.]+ s, max [\d.]+ s over {steps - 1} steps", done.stdout)
    assert re.search(r"link \?lesson=\.\.\.&step=\d+ -> step shown: [\d.]+ s", done.stdout)
    baseline = r"without a lesson -> busy until: [\d.]+ s .*; the link's step [+-][\d.]+ s"
    assert re.search(baseline, done.stdout)
