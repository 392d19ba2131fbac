"""The app in headless Chromium: a preset run, a three-policy comparison, the timeline, no console errors.

The tests share one page and run in order (Live, then Compare, then Explore on the Live
run; ``tests/conftest.py`` keeps them on one worker).  The settings that stand alone (a fraction
budget, a transcript, KV formats, the VRAM cap) are in ``test_ui_settings_browser.py``, on a page
of their own, so that the two run side by side.  Screenshots go to a temporary folder;
``THINKVIZ_SCREENSHOTS=docs`` refreshes the ones in ``docs/``.
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
LIVE_TOKENS = 32
COMPARE_TOKENS = 16
PROMPT_TOKENS_MIN = 100  # the muffins preset's system prompt + question


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("THINKVIZ_SCREENSHOTS")
    return (ROOT / folder) if folder else tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def page(app_url, browser):
    yield from watched_page(app_url, browser)


def watched_page(app_url, browser):
    """A page on the app once its model is ready, collecting console errors in ``page.problems``."""
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
    """Poll ``selector``'s text until it matches ``pattern`` (a regex, ``^`` at any line's start: while
    an event on it is pending, Gradio writes its timer, "0.4s", on a line above the value); fail with
    what it showed."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = page.inner_text(selector)
        if re.search(pattern, text, re.MULTILINE):
            return text
        if page.locator(".toast-body.error").count():
            pytest.fail(f"the app showed an error: {page.locator('.toast-body.error').first.inner_text()}")
        time.sleep(0.3)
    pytest.fail(f"{selector} never matched {pattern!r}; last text: {text!r}")


def open_chat_boxes(page, tab: str = "live") -> None:
    """Open the System prompt and trace accordion and wait until its boxes are drawn.

    The accordion mounts its boxes when first opened, and a box's first render sets its value: text
    typed before that (a loaded machine delays it) is wiped, so wait for the system prompt box, which
    renders with its default text, before typing into any of them."""
    page.get_by_text("System prompt and replay trace or transcript").first.click()
    page.wait_for_function(f"document.querySelector('#tv-{tab}-system textarea')?.value.length > 0", timeout=30_000)


def pick(page, selector: str, label: str) -> None:
    """Choose the option ``label`` (or the one option whose label starts with it) in a Gradio dropdown."""
    page.click(f"{selector} input")
    page.keyboard.press("Control+a")
    page.keyboard.type(label)
    exact = page.locator(f'[role=option][aria-label="{label}"]')
    if exact.count():
        exact.first.click()
    else:
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


def download(page, button: str, file_box: str, folder: Path) -> Path:
    """Click ``button``, then the link that appears in the ``file_box`` download; the saved file."""
    page.click(button)
    link = page.locator(f"{file_box} a").first
    link.wait_for(timeout=60_000)
    with page.expect_download() as started:
        link.click()
    path = folder / started.value.suggested_filename
    started.value.save_as(path)
    return path


def screenshot(page, folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / name), full_page=True)


def test_live_preset_run_paints_heat_coloured_tokens_by_appending_and_a_memory_chart(page, shots):
    pick(page, "#tv-live-preset", "Live: a short word problem")
    page.wait_for_function("document.querySelector('#tv-live-question textarea').value.includes('muffins')")
    set_number(page, "#tv-live-max-new", LIVE_TOKENS)
    set_number(page, "#tv-live-budget", 96)  # below the prompt, and the system prompt may go: evictions to see
    page.click("#tv-live-protect-system input")
    page.evaluate("""() => {  // count how the view changes: appended spans vs replaced content
        window.tvAppends = 0; window.tvRemovals = 0;
        new MutationObserver(ms => { for (const m of ms) {
            if ([...m.removedNodes].some(n => n.nodeType === 1)) window.tvRemovals++;
            else if ([...m.addedNodes].some(n => n.nodeType === 1 && n.matches('.tv-tok'))) window.tvAppends++;
        } }).observe(document.getElementById('tv-live-tokens'), {childList: true, subtree: true});
    }""")
    page.click("#tv-live-run")
    wait_for_text(page, "#tv-live-status", rf"Done: {LIVE_TOKENS} tokens generated", RUN_TIMEOUT)
    assert "prompted to think in <think> tags" in page.inner_text("#tv-live-status")  # the tag shown as text
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
    # the view grew by appends, frame after frame; only the final frame replaced it (exact end state)
    assert page.evaluate("window.tvAppends") >= 3
    assert page.evaluate("window.tvRemovals") == 1
    # evicted tokens shaded: gone from every layer and head, or from some (hatched)
    assert page.locator("#tv-live-tokens .tv-gone, #tv-live-tokens .tv-part").count() > 0
    page.locator("#tv-live-tokens").evaluate("el => el.scrollTop = 0")
    screenshot(page, shots, "live.png")


def test_view_mode_and_projection_rerender_the_finished_run(page):
    page.click("#tv-live-mode label:has-text('segments')")
    page.wait_for_selector("#tv-live-tokens .tv-mode-segments")
    assert page.locator("#tv-live-tokens .tv-tok").count() >= PROMPT_TOKENS_MIN + LIVE_TOKENS
    page.click("#tv-live-card label:has-text('24')")
    page.wait_for_function(
        "document.querySelector('#tv-live-memory').textContent.includes('24 GiB card')", timeout=60_000
    )
    page.click("#tv-live-mode label:has-text('combined')")
    page.wait_for_selector("#tv-live-tokens .tv-mode-combined")


def test_three_policy_comparison_streams_columns_and_a_fidelity_table(page, shots):
    page.get_by_role("tab", name="Compare").click()
    pick(page, "#tv-compare-preset", "Live: a short word problem")
    page.wait_for_function("document.querySelector('#tv-compare-question textarea').value.includes('muffins')")
    set_number(page, "#tv-compare-max-new", COMPARE_TOKENS)
    set_number(page, "#tv-compare-budget", 96)  # below the prompt: every policy must evict
    page.click("#tv-compare-protect-system input")  # let them evict the system prompt too
    checked = page.evaluate(
        "[...document.querySelectorAll('#tv-compare-policies input:checked')]"
        ".map(i => i.parentElement.innerText.trim())"
    )
    assert sorted(checked) == ["full", "h2o", "window"]
    page.click("#tv-compare-run")
    page.wait_for_function(
        "[0, 1, 2].every(i => document.querySelectorAll(`#tv-compare-tokens-${i} .tv-tok`).length > 100)",
        timeout=RUN_TIMEOUT * 1000,
    )
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
    wait_for_text(page, "#tv-explore-caption", r"Step \*?\*?\d+", 60)  # the newest run: the comparison's column
    pick(page, "#tv-explore-source", "Live 1")  # the Live run of the first test
    page.click("#tv-explore-open")
    wait_for_text(page, "#tv-explore-caption", rf"Step {LIVE_TOKENS - 1} of {LIVE_TOKENS - 1}", 60)
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
    pick(page, "#tv-explore-layer", "3")
    wait_for_text(page, "#tv-explore-caption", r"layer 3, kv-head all \(snapshot at step \d+\)", 60)


def test_a_recording_downloads_and_opens_again_in_explore(page, tmp_path):
    archive = download(page, "#tv-explore-export-run", "#tv-explore-export", tmp_path)
    assert archive.suffix == ".zip"
    set_number(page, "#tv-explore-step", 0)
    wait_for_text(page, "#tv-explore-caption", r"Step 0 ", 60)
    page.set_input_files("#tv-explore-upload input[type=file]", str(archive))
    wait_for_text(page, "#tv-explore-caption", rf"Step {LIVE_TOKENS - 1} of {LIVE_TOKENS - 1}", 60)


def test_no_errors_in_the_browser_console(page):
    assert page.problems == []
