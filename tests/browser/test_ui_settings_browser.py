"""The app's settings in headless Chromium, each test standing alone on the module's page: a
fraction budget (AdaKV's head allocation in Explore), an uploaded transcript, a quantized KV cache,
a preset's per-column KV formats, the VRAM cap on a CPU; then no console errors."""

from __future__ import annotations

import pytest
import torch

from test_ui_browser import (
    RUN_TIMEOUT,
    cell,
    open_chat_boxes,
    pick,
    set_number,
    table_rows,
    wait_for_text,
    watched_page,
)

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@pytest.fixture(scope="module")
def page(app_url, browser):
    yield from watched_page(app_url, browser)


def test_a_fraction_budget_with_adakv_shows_its_head_allocation_in_explore(page):
    page.get_by_role("tab", name="Live").click()
    pick(page, "#tv-live-policy", "adakv")
    page.click("#tv-live-budget-mode label:has-text('fraction')")
    page.wait_for_selector("#tv-live-budget-fraction", state="visible")
    assert not page.locator("#tv-live-budget").is_visible()  # the token budget does not apply now
    set_number(page, "#tv-live-budget-fraction", 0.5)
    set_number(page, "#tv-live-max-new", 8)
    system_protected = page.locator("#tv-live-protect-system input").is_checked()
    if system_protected:
        page.click("#tv-live-protect-system input")
    page.click("#tv-live-protect-question input")  # nothing protected: the heads share the budget freely
    page.click("#tv-live-run")
    wait_for_text(page, "#tv-live-status", r"Done: 8 tokens generated", RUN_TIMEOUT)
    memory = page.inner_text("#tv-live-memory")
    assert "50% of the tokens seen" in memory and "logical: tokens held" in memory  # padded heads
    page.get_by_role("tab", name="Explore").click()
    pick(page, "#tv-explore-source", "Live run")
    page.click("#tv-explore-open")
    wait_for_text(page, "#tv-explore-caption", r"on average \(\d+–\d+\) per layer and head", 60)
    assert page.locator("#tv-explore-kept .main-svg").count() >= 1
    assert "Tokens held per layer and kv-head" in page.inner_text("#tv-explore-kept")
    # leave Live as it was: h2o on a token budget, the protection toggles as they were
    page.get_by_role("tab", name="Live").click()
    pick(page, "#tv-live-policy", "h2o")
    page.click("#tv-live-budget-mode label:has-text('tokens')")
    page.wait_for_selector("#tv-live-budget", state="visible")
    if system_protected:
        page.click("#tv-live-protect-system input")
    page.click("#tv-live-protect-question input")


def test_an_uploaded_transcript_previews_its_turns_and_replays_with_tool_segments(page, tmp_path):
    import json

    from thought_trace import MESSAGES

    path = tmp_path / "agent.jsonl"
    path.write_text("\n".join(json.dumps({"role": r, "content": c}) for r, c in MESSAGES), encoding="utf-8")
    page.get_by_role("tab", name="Live").click()
    open_chat_boxes(page)
    page.set_input_files("#tv-live-upload input[type=file]", str(path))
    wait_for_text(page, "#tv-live-turns-caption", rf"{len(MESSAGES)} turns \(a transcript\): [\d,]+ tokens", 60)
    assert page.locator("#tv-live-run-mode input[value=replay]").is_checked()
    assert table_rows(page, "#tv-live-turns") == len(MESSAGES)
    assert [cell(page, "#tv-live-turns", r, 1) for r in range(len(MESSAGES))] == [role for role, _ in MESSAGES]
    set_number(page, "#tv-live-budget", 128)
    set_number(page, "#tv-live-limit", 176)  # its first turns: the first tool output is among them
    page.click("#tv-live-run")
    wait_for_text(page, "#tv-live-status", r"Done: 176 tokens replayed", RUN_TIMEOUT)
    assert page.locator("#tv-live-tokens .tv-seg-tool").count() > 20
    assert "1 failed, 1 passed" in page.inner_text("#tv-live-tokens")
    page.fill("#tv-live-trace textarea", '[{"role": "robot", "content": "x"}]')
    wait_for_text(page, "#tv-live-turns-caption", r"Cannot replay this: .*unknown role 'robot'", 60)


def test_a_live_run_with_a_quantized_kv_cache_shows_its_format(page):
    page.get_by_role("tab", name="Live").click()
    page.click("#tv-live-run-mode label:has-text('generate')")
    pick(page, "#tv-live-kv-quant", "q4_0")
    set_number(page, "#tv-live-max-new", 6)
    page.click("#tv-live-run")
    wait_for_text(page, "#tv-live-status", r"Done: 6 tokens generated", RUN_TIMEOUT)
    assert "q4_0" in page.inner_text("#tv-live-stats")
    page.wait_for_function(
        "document.querySelector('#tv-live-memory').textContent.includes('physical, q4_0')", timeout=60_000
    )
    pick(page, "#tv-live-kv-quant", "none")


def test_the_quantize_or_evict_preset_sets_each_compare_columns_format(page):
    page.get_by_role("tab", name="Compare").click()
    pick(page, "#tv-compare-preset", "Quantize or evict?")
    page.wait_for_function("document.querySelector('#tv-compare-question textarea').value.includes('2×n strip')")
    page.click("#tv-compare-kv button")  # open the accordion: its dropdowns are drawn only then
    page.wait_for_function(
        "document.querySelector('#tv-compare-full-kv-quant input')?.value === 'q4_0'", timeout=60_000
    )
    assert "full: KV format" in page.inner_text("#tv-compare-full-kv-quant")
    assert page.locator("#tv-compare-h2o-kv-quant input").input_value() == "none"
    assert not page.locator("#tv-compare-tova-kv-quant").is_visible()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_the_vram_cap_setting_is_refused_on_a_cpu_with_a_message(page):
    page.get_by_role("tab", name="Live").click()
    page.get_by_text("Model settings").first.click()
    assert "No VRAM cap" in page.inner_text("#tv-vram-cap-status")
    page.locator("#tv-vram-cap input").fill("8")
    page.click("#tv-vram-cap-set")
    toast = page.locator(".toast-body.error")
    toast.first.wait_for(timeout=30_000)
    assert "a VRAM cap needs a CUDA GPU, and this machine has none" in toast.first.inner_text()


def test_no_errors_in_the_browser_console(page):
    assert page.problems == []
