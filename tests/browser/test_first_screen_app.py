"""The first screen and the status before a run, in Chromium on the app around a tiny model (#34): a
fresh page opens Live with a preset picked whose recording plays at once, the price follows the
trace limit, and an uploaded transcript shows its own system prompt and question."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from test_ui_browser import open_chat_boxes, pick, set_number, wait_for_text
from tiny_app import served_app, served_demo

from thinkviz.demos.presets import load_preset
from thinkviz.text.chat import REASONING_SYSTEM_PROMPT
from thinkviz.ui.price import LOADING

pytestmark = pytest.mark.browser

MODEL_TIMEOUT = 120
TRACE = "<think>\n" + " ".join(f"Step {i}: add {i} to the total." for i in range(80)) + "\n</think>\n42"
FILE_SYSTEM, FILE_QUESTION = "You are a terse tutor.", "What is 7 times 6?"
TRACE_TOKENS = re.compile(r"\(([\d,]+) trace tokens after a")


@pytest.fixture(scope="module")
def app_url():
    with served_app() as url:
        yield url


@pytest.fixture
def page(app_url, browser):
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
    page = context.new_page()
    page.goto(app_url)
    yield page
    context.close()


def boxes(page) -> dict:
    """The System prompt and Question boxes: value, label, editable."""
    return page.evaluate("""() => Object.fromEntries(['system', 'question'].map(name => {
        const box = document.querySelector(`#tv-live-${name}`);
        const area = box.querySelector('textarea');
        return [name, {value: area.value, label: box.querySelector('[data-testid=block-info]').textContent,
                       editable: !area.disabled}];
    }))""")


def test_a_fresh_page_has_a_preset_picked_whose_recording_plays_at_once(page):
    title = load_preset("generate_muffins").title
    page.wait_for_function(f"document.querySelector('#tv-live-preset input')?.value === {json.dumps(title)}")
    page.wait_for_function("() => document.querySelector('#tv-live-play')?.disabled === false", timeout=30_000)
    assert "muffins" in page.input_value("#tv-live-question textarea")  # its chat, knobs and notice with it
    assert page.locator("#tv-live-tokens .tv-tok").count() == 0
    page.click("#tv-live-play")  # nothing else touched
    wait_for_text(page, "#tv-live-status", r"^▶ Recording|^Done: .*recording", 60)
    page.wait_for_function("document.querySelectorAll('#tv-live-tokens .tv-tok').length > 100", timeout=60_000)
    page.click("#tv-live-stop")


def test_the_price_changes_when_the_trace_limit_changes(page, capfd):
    wait_for_text(page, "#tv-model-status", "Model: Ready", MODEL_TIMEOUT)
    wait_for_text(page, "#tv-live-price", r"on this machine", 60)  # the preset's generation, priced
    # once its load events end, an idle page asks the server nothing (the price lines once re-ran 8 times a
    # second for as long as the page was open)
    asked: list[float] = []
    page.on("request", lambda request: asked.append(time.monotonic()) if "/queue/join" in request.url else None)
    start = time.monotonic()
    while time.monotonic() - max([start, *asked]) < 1.5:  # a second and a half without one
        assert time.monotonic() - start < 20, f"{len(asked)} events in {time.monotonic() - start:.0f} s of an idle page"
        page.wait_for_timeout(250)
    page.click("#tv-live-run-mode label:has-text('replay')")
    open_chat_boxes(page)
    page.fill("#tv-live-trace textarea", TRACE)
    whole = wait_for_text(page, "#tv-live-price", TRACE_TOKENS.pattern, 60)
    assert int(TRACE_TOKENS.search(whole).group(1).replace(",", "")) > 300
    set_number(page, "#tv-live-limit", 64)
    limited = wait_for_text(page, "#tv-live-price", r"\(64 trace tokens after a", 60)
    assert re.search(r"takes (under|about) [\w ]+ on this machine", limited), limited
    page.get_by_role("tab", name="Sweep").click()  # a sweep is priced before it starts
    wait_for_text(page, "#tv-sweep-price", r"^This sweep takes .* on this machine \(512 trace tokens", 60)
    assert "Traceback" not in capfd.readouterr().err  # no handler failed (replay picked by hand, no file)


def test_an_uploaded_transcript_shows_its_own_system_prompt_and_question_until_it_is_cleared(page, tmp_path):
    path = tmp_path / "tutor.jsonl"
    messages = [("system", FILE_SYSTEM), ("user", FILE_QUESTION), ("assistant", "<think>\n7 × 6 = 42\n</think>\n42")]
    path.write_text("\n".join(json.dumps({"role": r, "content": c}) for r, c in messages), encoding="utf-8")
    page.wait_for_function("document.querySelector('#tv-live-question textarea')?.value.includes('muffins')")
    open_chat_boxes(page)  # its boxes are drawn when open
    before = boxes(page)
    assert before["system"]["editable"] and before["system"]["value"] == REASONING_SYSTEM_PROMPT
    page.set_input_files("#tv-live-upload input[type=file]", str(path))
    page.wait_for_function(
        f"document.querySelector('#tv-live-question textarea')?.value === {json.dumps(FILE_QUESTION)}"
    )
    shown = boxes(page)
    assert shown["system"] == {"value": FILE_SYSTEM, "label": shown["system"]["label"], "editable": False}
    assert not shown["question"]["editable"]
    assert "from the file" in shown["system"]["label"] and "from the file" in shown["question"]["label"]
    assert page.locator("#tv-live-run-mode input[value=replay]").is_checked()
    page.click("#tv-live-upload button[aria-label='Clear']")
    page.wait_for_function("document.querySelector('#tv-live-question textarea')?.value.includes('muffins')")
    after = boxes(page)
    assert after == before
    assert page.input_value("#tv-live-trace textarea") == ""


def test_every_tabs_price_follows_the_model_once_it_has_loaded(browser):
    """The page opens while the model loads: each tab's price says so, then prices its run once the
    load ends (the hidden model key's change re-prices every tab; opening a tab prices nothing)."""
    loading = "(?i)" + re.escape(LOADING)  # the line starts with it, capitalised
    loads = threading.Event()
    with served_demo(loads=loads) as demo:
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        page = context.new_page()
        page.goto(demo.local_url)
        wait_for_text(page, "#tv-live-price", loading, 60)
        page.get_by_role("tab", name="Compare").click()
        pick(page, "#tv-compare-preset", "Live: a short word problem")  # a question to price
        wait_for_text(page, "#tv-compare-price", loading, 60)
        page.get_by_role("tab", name="Sweep").click()
        wait_for_text(page, "#tv-sweep-price", loading, 60)
        loads.set()
        wait_for_text(page, "#tv-model-status", "Model: Ready", MODEL_TIMEOUT)
        wait_for_text(page, "#tv-sweep-price", r"on this machine", 60)
        for tab, line in (("Compare", "#tv-compare-price"), ("Live", "#tv-live-price")):
            page.get_by_role("tab", name=tab).click()
            wait_for_text(page, line, r"on this machine", 60)
        context.close()
