"""A policy knob with named choices, through the whole app: a dropdown slot in Chromium and the API.

The app is built in this process around a tiny model with a test-only policy that declares a
choice (:class:`~test_param_choices.ChoosyPolicy`), launched on a free 127.0.0.1 port.
"""

from __future__ import annotations

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from test_app_client import _live_args
from test_param_choices import ChoosyPolicy
from test_ui_browser import download, pick, wait_for_text
from tiny_app import served_app

from thinkviz.export import import_recording

pytestmark = pytest.mark.browser

QUESTION = "Which end of the sequence survives?"


@pytest.fixture(scope="module")
def app_url():
    with served_app(ChoosyPolicy) as url:
        yield url


def test_the_choice_dropdown_shows_the_policys_choices_and_its_value_reaches_the_run(app_url, browser, tmp_path):
    page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
    page.goto(app_url)
    wait_for_text(page, "#tv-model-status", "Model: Ready", 120)
    choice = page.locator("#tv-live-choice-0")
    choice.wait_for(state="visible", timeout=30_000)  # the default policy, h2o, has one: normalize
    assert "normalize" in choice.inner_text()
    pick(page, "#tv-live-policy", "window")
    choice.wait_for(state="hidden", timeout=30_000)  # window has no choice knob
    pick(page, "#tv-live-policy", "choosy")
    choice.wait_for(state="visible", timeout=30_000)
    assert "keep" in choice.inner_text()
    page.click("#tv-live-choice-0 input")
    options = page.locator("#tv-live-choice-0 [role=option]")
    options.first.wait_for(timeout=10_000)
    assert [options.nth(i).get_attribute("aria-label") for i in range(options.count())] == ["newest", "oldest"]
    options.filter(has_text="oldest").click()
    page.fill("#tv-live-question textarea", QUESTION)
    page.click("#tv-live-run")
    wait_for_text(page, "#tv-live-status", r"Done: \d+ tokens generated", 120)
    archive = download(page, "#tv-live-export-run", "#tv-live-export", tmp_path)
    assert import_recording([archive]).meta["params"]["keep"] == "oldest"
    pick(page, "#tv-live-policy", "window")
    choice.wait_for(state="hidden", timeout=30_000)
    page.context.close()


def test_api_callers_pass_a_choice_by_name_and_get_a_message_for_any_other(app_url):
    client = Client(app_url, verbose=False)
    from thinkviz.ui.controls import pool_sizes, slot_specs

    args = _live_args(policy="choosy", budget=16, max_new_tokens=4)
    choices = slot_specs("choosy", pool_sizes())[2]  # the choice slots: as many as any policy has choice knobs
    slot = len(args) - 6 - len(choices)  # the first, after the number and checkbox slots (6 values after them)
    assert args[slot] == "newest"
    args[slot] = "oldest"
    assert client.predict(*args, api_name="/generate")[0].startswith("Done: 4 tokens generated")
    args[slot] = "sideways"
    with pytest.raises(AppError, match="sideways"):
        client.predict(*args, api_name="/generate")
