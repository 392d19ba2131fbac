"""dynts' two prediction heat modes through the whole app in Chromium: offered only for dynts,
painted from the predictions and, once the run has answered, from the attention its answer paid;
Explore offers them for the recorded run.

The app is built in this process around a tiny model, with a (random) predictor saved for it.
"""

from __future__ import annotations

import pytest
import torch
from test_ui_browser import open_chat_boxes, pick, wait_for_text
from tiny_app import served_app

from thinkviz import predictor as P
from thinkviz.policies.dynts import DynTS
from tiny_models import tiny_model

pytestmark = pytest.mark.browser

TRACE = "<think>\nFirst add 1 and 2.\n\nThen add 3 to get 6.\n</think>\n\nThe sum is 6.\n"


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    folder = tmp_path_factory.mktemp("assets")
    tiny = tiny_model("llama")
    size = tiny.model.config.hidden_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        head = P.ImportancePredictor(size).eval()
    P.save(
        head, P.PredictorMeta(model=tiny.name, hidden_size=size, width=head.width), P.predictor_path(tiny.name, folder)
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DynTS, "predictor_folder", folder)
        with served_app() as url:
            yield url


def _heated(page, root: str) -> int:
    """Heated tokens of the view (not the legend's colour swatches, which Explore shows in the same box)."""
    return page.evaluate(
        f"[...document.querySelectorAll('{root} .tv-tok')]"
        ".filter(t => /tv-h[0-9]/.test(t.className) && !t.closest('.tv-legend')).length"
    )


def test_dynts_offers_predicted_importance_and_the_answers_attention(app_url, browser):
    page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
    page.goto(app_url)
    wait_for_text(page, "#tv-model-status", "Model: Ready", 120)
    modes = page.locator("#tv-live-mode")
    assert "predicted importance" not in modes.inner_text()  # h2o, the default, predicts nothing
    pick(page, "#tv-live-policy", "dynts")
    page.wait_for_function(
        "document.querySelector('#tv-live-mode').innerText.includes('attention from the answer')", timeout=30_000
    )
    open_chat_boxes(page)
    page.click("#tv-live-run-mode label:has-text('replay')")
    page.fill("#tv-live-question textarea", "Sum 1, 2 and 3.")
    page.fill("#tv-live-trace textarea", TRACE)
    # the server has the trace (its preview counts it) before Run sends the inputs
    wait_for_text(page, "#tv-live-turns-caption", r"the assistant's text after the question\): [\d,]+ tokens", 60)
    page.click("#tv-live-run")
    wait_for_text(page, "#tv-live-status", r"Done: \d+ tokens replayed.*Attention from the answer measured", 120)
    total = page.locator("#tv-live-tokens .tv-tok").count()
    page.click("#tv-live-mode label:has-text('predicted importance')")
    page.wait_for_selector("#tv-live-tokens .tv-mode-predicted")
    assert _heated(page, "#tv-live-tokens") == total  # every token got a prediction as it was written
    page.click("#tv-live-mode label:has-text('attention from the answer')")
    page.wait_for_selector("#tv-live-tokens .tv-mode-answer")
    answer_heat = _heated(page, "#tv-live-tokens")
    assert 0 < answer_heat < total  # the tokens before the answer; the answer's own tokens have none
    page.get_by_role("tab", name="Explore").click()
    page.wait_for_function(
        "document.querySelector('#tv-explore-mode').innerText.includes('predicted importance')", timeout=30_000
    )
    page.click("#tv-explore-mode label:has-text('attention from the answer')")
    wait_for_text(page, "#tv-explore-caption", "attention the answer paid", 30)
    assert _heated(page, "#tv-explore-tokens") == answer_heat
    page.get_by_role("tab", name="Live").click()
    pick(page, "#tv-live-policy", "h2o")
    page.wait_for_function(
        "!document.querySelector('#tv-live-mode').innerText.includes('predicted importance')", timeout=30_000
    )
    page.context.close()
