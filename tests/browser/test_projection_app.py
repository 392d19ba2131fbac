"""The Live memory chart's projection through the served app: a played recording in Chromium (what it
says about h2o, #34) and "the loaded model" priced on the model that runs (#37)."""

from __future__ import annotations

import json
import re

import pytest
from gradio_client import Client
from test_ui_browser import MODEL_TIMEOUT, RUN_TIMEOUT, pick, wait_for_text
from tiny_app import served_app

pytestmark = pytest.mark.browser

TEXTS_JS = """(sel) => [...document.querySelectorAll(`#tv-live-memory ${sel}`)].map(e => e.textContent)"""


@pytest.fixture(scope="module")
def page(app_url, browser):
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
    page = context.new_page()
    page.goto(app_url)
    wait_for_text(page, "#tv-model-status", "Model: ", MODEL_TIMEOUT)  # a recording plays without the model
    yield page
    context.close()


@pytest.mark.integration  # the app.py of the other browser tests, with the embedded model
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


def test_generate_projects_the_loaded_model_on_its_own_shape():
    # the app around a tiny random Llama: 2 layers, 2 kv-heads of 16 (4 query heads), so 256 bytes
    # a token in bf16 on the card, where the default target, Qwen3-4B, costs 147,456
    with served_app() as url:
        client = Client(url, verbose=False)
        outputs = client.predict(
            question="What is 2+2?", max_new_tokens=4, project_onto="the loaded model", card_gib=8, api_name="/generate"
        )
    (plot,) = [json.loads(o["plot"]) for o in outputs if isinstance(o, dict) and o.get("type") == "plotly"]
    titles = [a.get("text", "") for a in plot["layout"]["annotations"]]
    assert "Projected on tiny-llama (random) (4-bit weights), 8 GiB card (GiB)" in titles
    lines = {t["name"] for t in plot["data"]}
    assert {"policy on tiny-llama (random)", "full cache on tiny-llama (random)"} <= lines
