"""The price of a run before it starts (#34): what the controls describe, on a tiny model, for Live,
Compare and Sweep; and Live's "Enable thinking" (#37) from the checkbox to the prompt."""

from __future__ import annotations

import copy
import re
from dataclasses import replace

import gradio as gr
import pytest

from gguf_models import QWEN3_TEMPLATE
from thinkviz.core.engine import DecodeSettings
from thinkviz.measure.comparison import Column, plan
from thinkviz.measure.requests import RunInput, RunInputError, prepare
from thinkviz.models.loading import LoadedModel
from thinkviz.policies import make_policy
from thinkviz.ui import inputs
from thinkviz.ui.chat_controls import thinking_switch
from thinkviz.ui.model_slot import ModelSlot
from thinkviz.ui.price import LOADING, Work, price_line, sweep_price, work_price
from thinkviz.ui.sweep_run import sweep_request
from thinkviz.ui.tabs import AppContext, compare, live
from thinkviz.ui.widgets import named
from tiny_models import tiny_model

TRACE = "<think>\n" + " ".join(f"Step {i}: add {i} to the total and carry on." for i in range(60)) + "\n</think>\n42"


def _slot(loaded: LoadedModel) -> ModelSlot:
    slot = ModelSlot(loader=lambda name, quantization, device, progress=None: loaded)
    slot.start("tiny", "none")
    assert slot.wait(120).ready and slot.speed is not None
    return slot


@pytest.fixture(scope="module")
def slot() -> ModelSlot:
    return _slot(tiny_model("llama"))


@pytest.fixture(scope="module")
def qwen3() -> LoadedModel:
    """The tiny Llama with a Qwen3-style chat template (``enable_thinking``)."""
    plain = tiny_model("llama")
    tokenizer = copy.deepcopy(plain.tokenizer)
    tokenizer.chat_template = QWEN3_TEMPLATE
    return LoadedModel.wrap(plain.model, tokenizer, "tiny-qwen3-template", "none", plain.device, "none")


def _work(limit: int | None, measure: bool = False, policy: str = "h2o") -> Work:
    run = RunInput(system=None, question="What is the total?", trace=TRACE, max_tokens=limit)
    return Work([Column(make_policy(policy, budget=64))], run, DecodeSettings(max_new_tokens=16), measure, False)


def _seconds(line: str) -> str:
    return re.search(r"takes (at most )?(about [\w ]+?|under 5 s) on this machine", line).group(0)


def test_the_price_follows_the_trace_limit_and_says_what_it_counts(slot):
    short, whole = work_price(slot, _work(64)), work_price(slot, _work(None))
    assert "(64 trace tokens after a " in short and "1 run side by side" in short
    assert re.search(r"\(\d{3},?\d* trace tokens", whole) and short != whole
    measured = work_price(slot, _work(64, measure=True))
    assert "2 runs side by side" in measured  # the full cache in lockstep
    generated = work_price(slot, replace(_work(None), run_input=RunInput(None, "What is 2 + 3?")))
    assert "takes at most " in generated and "up to 16 new tokens" in generated


def test_a_finished_runs_error_is_folded_into_the_next_price(slot):
    work = _work(64)
    before = slot.speed.correction
    try:
        loaded = slot.loaded
        prompt, trace = prepare(loaded, work.run_input)
        phases = plan(work.columns, len(prompt.ids), len(trace), work.settings, measure=False, reference_run=False)
        slot.speed.learn(phases, 40 * slot.speed.estimate(phases))  # the run took far longer than priced
        after = work_price(slot, work)
        assert slot.speed.correction > before and re.search(r"corrected ×\d+\.\d\d by the runs so far", after)
    finally:
        slot.speed.correction = before


def test_before_the_model_has_loaded_the_price_comes_later_and_bad_input_gets_its_reason():
    assert price_line(ModelSlot(), lambda: _work(64)) == LOADING[0].upper() + LOADING[1:] + "."
    loaded = tiny_model("llama")
    slot = _slot(loaded)
    empty = replace(_work(None), run_input=RunInput(None, ""))
    assert price_line(slot, lambda: empty).startswith("Not ready to run: The question is empty")
    line = price_line(slot, lambda: _work(64), "generate_muffins")
    assert _seconds(line) and line.endswith("▶ Play recording plays the preset at once, no model needed.")


def test_a_sweep_is_priced_group_by_group_before_it_starts(slot):
    trace = inputs.replay_choices(inputs.preset_choices())[1]
    values = dict(
        trace=trace,
        policies=["h2o", "window"],
        budgets="0.5, 64",
        budget_mode="tokens",
        interval=8.0,
        protect_system=True,
        protect_question=True,
        knobs="",
        trace_tokens=64.0,
        vary="",
    )
    line = sweep_price(slot, lambda: sweep_request(**values))
    assert line.startswith("This sweep takes ") and "(64 trace tokens after a " in line
    assert "2 groups one after another, 3 runs side by side" in line
    wider = sweep_price(slot, lambda: sweep_request(**{**values, "budgets": "0.25, 0.5, 64"}))
    assert "3 groups" in wider
    assert sweep_price(slot, lambda: sweep_request(**{**values, "trace": None})).startswith(
        "Not ready to sweep: Choose a trace"
    )


def _app(demo: gr.Blocks, slot: ModelSlot) -> AppContext:
    return AppContext(
        demo=demo,
        slot=slot,
        session=gr.State(),
        bus=gr.Textbox(),
        model_status=gr.Markdown(),
        model_ready=gr.Textbox(),
        presets=inputs.preset_choices(),
        model="t",
        quantization="none",
        model_loading=False,
    )


def _live_tab(slot: ModelSlot) -> live.LiveTab:
    with gr.Blocks() as demo:
        return live.layout(_app(demo, slot))


def _values(tab: live.LiveTab, **changes) -> dict:
    values = {name: component.value for name, component in named(*tab.run_groups()).items()}
    return {**values, **changes}


def test_lives_price_handler_prices_its_own_controls_and_the_limit_changes_it(slot):
    tab = _live_tab(slot)
    replay = dict(run_mode="replay", question="What is the total?", trace=TRACE)
    first = live.price_live(tab, None, **_values(tab, max_trace_tokens=64, **replay))[tab.price]
    second = live.price_live(tab, None, **_values(tab, max_trace_tokens=128, **replay))[tab.price]
    assert "(64 trace tokens" in first and "(128 trace tokens" in second
    half_set = live.price_live(tab, None, **_values(tab, budget=16, **replay))[tab.price]  # under h2o's recent 32
    assert half_set.startswith("Not ready to run: ") and "budget (16)" in half_set


def test_enable_thinking_shows_only_for_a_model_that_can_switch_it_and_reaches_the_prompt(slot, qwen3):
    assert not inputs.can_switch_thinking(slot.loaded) and inputs.can_switch_thinking(qwen3)
    assert thinking_switch(slot)["visible"] is False
    qwen3_slot = _slot(qwen3)
    assert thinking_switch(qwen3_slot)["visible"] is True
    tab = _live_tab(qwen3_slot)
    for enabled, ending in ((True, "<|im_start|>assistant\n<think>\n"), (False, "<think>\n\n</think>\n\n")):
        asked = live.live_request(tab, _values(tab, question="What is 2 + 3?", enable_thinking=enabled))
        prompt, _ = prepare(qwen3, asked.run_input)
        assert prompt.text.endswith(ending), prompt.text[-60:]
        assert prompt.reasoning.template_kwargs == {"enable_thinking": enabled}
    off = live.live_request(tab, _values(tab, question="Hi", enable_thinking=False))
    assert prepare(qwen3, off.run_input)[0].reasoning.describe().startswith("Qwen3 template: thinking switched off")


def test_compares_price_handler_counts_its_columns(slot):
    with gr.Blocks() as demo:
        tab = compare.layout(_app(demo, slot))
    values = {name: component.value for name, component in named(*tab.run_groups()).items()}
    replay = dict(run_mode="replay", question="What is the total?", trace=TRACE, max_trace_tokens=64)
    line = compare.price_compare(tab, None, **{**values, **replay})[tab.price]
    assert "(64 trace tokens after a " in line and "3 runs side by side" in line  # window, h2o + the full cache
    wider = compare.price_compare(tab, None, **{**values, **replay, "vary": "recent=8,16"})[tab.price]
    assert "4 runs side by side" in wider  # h2o twice (window has no recent), in lockstep with the full cache


def test_a_reason_that_ends_its_own_sentence_ends_the_line_once(slot):
    def work() -> Work:
        raise RunInputError("The question is empty: type a prompt or pick a preset.")

    assert price_line(slot, work) == "Not ready to run: The question is empty: type a prompt or pick a preset."
    with_note = price_line(slot, work, "generate_muffins")
    assert with_note.startswith("Not ready to run: The question is empty: type a prompt or pick a preset; ")
    assert not with_note.endswith("..")
