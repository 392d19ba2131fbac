"""The app in headless Chromium: a preset run, a three-policy comparison, the timeline, no console errors.

The tests share one page and run in order (Live, then Compare, then Explore on the Live
run).  Screenshots go to a temporary folder; ``THINKVIZ_SCREENSHOTS=docs`` refreshes the
ones in ``docs/``.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
MODEL_TIMEOUT = 240  # s: the page is up before the model; loading competes for 2 cores
RUN_TIMEOUT = 300  # s for one short run on a busy CPU
LIVE_TOKENS = 48
COMPARE_TOKENS = 24
PROMPT_TOKENS_MIN = 100  # the muffins preset's system prompt + question


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("THINKVIZ_SCREENSHOTS")
    return (ROOT / folder) if folder else tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def page(app_url, browser):
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
    page = context.new_page()
    page.problems = []
    page.on("console", lambda m: page.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: page.problems.append(f"page error: {e}"))
    page.goto(app_url)
    wait_for_text(page, "#tv-model-status", "Model: Ready", MODEL_TIMEOUT)
    yield page
    context.close()


def wait_for_text(page, selector: str, pattern: str, timeout: float) -> str:
    """Poll ``selector``'s text until it matches ``pattern`` (a regex); fail with what it showed."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = page.inner_text(selector)
        if re.search(pattern, text):
            return text
        if page.locator(".toast-body.error").count():
            pytest.fail(f"the app showed an error: {page.locator('.toast-body.error').first.inner_text()}")
        time.sleep(0.3)
    pytest.fail(f"{selector} never matched {pattern!r}; last text: {text!r}")


def pick(page, selector: str, label: str) -> None:
    """Choose ``label`` in the Gradio dropdown ``selector``."""
    page.click(f"{selector} input")
    page.keyboard.type(label)
    page.keyboard.press("Enter")


def set_number(page, selector: str, value: int) -> None:
    """Type into a Gradio slider's number box."""
    box = page.locator(f"{selector} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")


def table_rows(page, selector: str) -> int:
    """Body rows of a Gradio dataframe (its grid counts the header row too)."""
    return int(page.get_attribute(f"{selector} [role=grid]", "aria-rowcount")) - 1


def cell(page, selector: str, row: int, col: int) -> str:
    """Text of a Gradio dataframe cell."""
    return page.inner_text(f"{selector} [data-testid=cell-{row}-{col}]").strip()


def screenshot(page, folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / name), full_page=True)


def test_live_preset_run_paints_heat_coloured_tokens_by_appending_and_a_memory_chart(page, shots):
    pick(page, "#tv-live-preset", "Live: a short word problem")
    page.wait_for_function("document.querySelector('#tv-live-question textarea').value.includes('muffins')")
    set_number(page, "#tv-live-max-new", LIVE_TOKENS)
    set_number(page, "#tv-live-budget", 96)  # below the prompt, and the system prompt may go: evictions to see
    page.click("#tv-live-protect-system input")
    page.evaluate("""() => {
        window.tvRemovedTokens = 0;
        new MutationObserver(ms => { for (const m of ms) for (const n of m.removedNodes)
            if (n.nodeType === 1 && (n.matches('.tv-tok') || n.querySelector?.('.tv-tok'))) window.tvRemovedTokens++; })
          .observe(document.getElementById('tv-live-tokens'), {childList: true, subtree: true});
    }""")
    page.click("#tv-live-run")
    page.wait_for_function(f"document.querySelectorAll('#tv-live-tokens .tv-tok').length > {PROMPT_TOKENS_MIN}",
                           timeout=RUN_TIMEOUT * 1000)
    page.evaluate("window.tvFirst = document.querySelector('#tv-live-tokens .tv-tok')")
    first_count = page.evaluate("document.querySelectorAll('#tv-live-tokens .tv-tok').length")
    page.wait_for_function(
        f"document.querySelectorAll('#tv-live-tokens .tv-tok').length >= {first_count + 5}"
        " || document.querySelector('#tv-live-status').innerText.startsWith('Done')",
        timeout=RUN_TIMEOUT * 1000)
    streaming = page.inner_text("#tv-live-status")
    if not streaming.startswith("Done"):  # still streaming: the old spans are the same nodes, nothing was removed
        assert page.evaluate("window.tvFirst.isConnected")
        assert page.evaluate("window.tvRemovedTokens") == 0
    wait_for_text(page, "#tv-live-status", rf"Done: {LIVE_TOKENS} tokens generated", RUN_TIMEOUT)
    tokens = page.locator("#tv-live-tokens .tv-tok")
    assert tokens.count() >= PROMPT_TOKENS_MIN + LIVE_TOKENS
    heat = page.evaluate("""() => [...document.querySelectorAll('#tv-live-tokens .tv-tok')]
        .filter(t => /tv-h[1-9]/.test(t.className))
        .map(t => getComputedStyle(t).backgroundColor)""")
    assert len(heat) > 10 and len(set(heat)) >= 3  # several heat shades actually painted
    assert "<think>" in page.inner_text("#tv-live-tokens")  # tags shown as text
    assert page.locator("#tv-live-memory .main-svg").count() >= 1
    assert page.locator("#tv-live-memory .scatterlayer .trace").count() >= 3
    assert "tok/s" in page.inner_text("#tv-live-stats")
    page.locator("#tv-live-tokens").evaluate("el => el.scrollTop = 0")
    assert page.locator("#tv-live-tokens .tv-gone").count() > 0  # evicted tokens greyed out
    screenshot(page, shots, "live.png")


def test_three_policy_comparison_streams_columns_and_a_fidelity_table(page, shots):
    page.get_by_role("tab", name="Compare").click()
    pick(page, "#tv-compare-preset", "Live: a short word problem")
    page.wait_for_function("document.querySelector('#tv-compare-question textarea').value.includes('muffins')")
    set_number(page, "#tv-compare-max-new", COMPARE_TOKENS)
    set_number(page, "#tv-compare-budget", 96)  # below the prompt: every policy must evict
    page.click("#tv-compare-protect-system input")  # let them evict the system prompt too
    checked = page.evaluate("[...document.querySelectorAll('#tv-compare-policies input:checked')]"
                            ".map(i => i.parentElement.innerText.trim())")
    assert sorted(checked) == ["full", "h2o", "window"]
    page.click("#tv-compare-run")
    page.wait_for_function(
        "[0, 1, 2].every(i => document.querySelectorAll(`#tv-compare-tokens-${i} .tv-tok`).length > 100)",
        timeout=RUN_TIMEOUT * 1000)
    wait_for_text(page, "#tv-compare-status", r"^Done", RUN_TIMEOUT)
    for i, name in enumerate(["full", "window", "h2o"]):
        assert name in page.inner_text(f"#tv-compare-head-{i}")
        assert page.locator(f"#tv-compare-tokens-{i} .tv-tok").count() > 100
    assert not page.locator("#tv-compare-tokens-3").is_visible()
    assert table_rows(page, "#tv-compare-table") == 3
    assert [cell(page, "#tv-compare-table", r, 0) for r in range(3)] == ["full", "window", "h2o"]
    assert cell(page, "#tv-compare-table", 0, 3) == "0.0000"  # the full cache against itself
    assert float(cell(page, "#tv-compare-table", 1, 3)) > 0  # window evicted: its distributions moved
    assert page.locator("#tv-compare-memory .scatterlayer .trace").count() == 4
    screenshot(page, shots, "compare.png")


def test_timeline_slider_moves_the_explored_step(page, shots):
    page.get_by_role("tab", name="Explore").click()
    wait_for_text(page, "#tv-explore-caption", r"Step \*?\*?\d+", 60)
    last = page.locator("#tv-explore-tokens .tv-tok").count()
    set_number(page, "#tv-explore-step", 5)
    wait_for_text(page, "#tv-explore-caption", r"Step 5 ", 60)
    page.wait_for_function(f"document.querySelectorAll('#tv-explore-tokens .tv-tok').length < {last}")
    early = page.locator("#tv-explore-tokens .tv-tok").count()
    assert early == last - (LIVE_TOKENS - 1 - 5)  # one token per generated step
    assert page.locator("#tv-explore-heatmap .main-svg").count() >= 1
    assert table_rows(page, "#tv-explore-segments") >= 2
    set_number(page, "#tv-explore-step", LIVE_TOKENS - 1)
    wait_for_text(page, "#tv-explore-caption", rf"Step {LIVE_TOKENS - 1} ", 60)
    screenshot(page, shots, "explore.png")


def test_no_errors_in_the_browser_console(page):
    assert page.problems == []
