"""The projection onto a card follows each policy's own cap (:class:`KeptCap`), for every registered
policy, before and after it reaches its budget: a cache that holds a budget never "keeps growing"
and runs out only where its cap is more than the card holds."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.core.events import RunRecord
from thinkviz.core.kvquant import KVQuant
from thinkviz.memory import GIB, Projection, TargetModel
from thinkviz.policies import make_policy, policy_class, policy_names, policy_params
from thinkviz.text.chat import build_chat
from thinkviz.ui.compare_run import FIDELITY_COLUMNS, fidelity_row
from thinkviz.ui.inputs import LOADED_TARGET
from thinkviz.ui.session import Session
from thinkviz.ui.tabs.live import reproject
from thinkviz.units import format_bytes
from thinkviz.viz.memory_chart import memory_figure
from thinkviz.viz.memory_projection import kept_cap, projection_outcome
from thinkviz.viz.run_series import tokens_seen
from thinkviz.viz.tables import peak_kv_bytes, stats_strip
from tiny_models import tiny_model
from viz_records import replayed

SYSTEM = "You are a careful assistant. Think inside <think> tags, then answer."
QUESTION = "Fix def area(r: float) -> float: it returns 2*pi*r instead of pi*r**2. Why?"
STEPS = 20
ROOMY = Projection.named("Qwen3-4B", 24)  # a card the caps of these short runs fit many times over


def _knobs(name: str) -> dict:
    """Sinks and windows small enough for a budget of 24 (as the invariant matrix sets them)."""
    declared = {p.name for p in policy_params(name)}
    return {k: v for k, v in (("n_sink", 4), ("recent", 6), ("window", 6)) if k in declared}


def _record(loaded, name: str, budget: int, interval: int = 4, kv_quant: KVQuant = KVQuant(), **knobs):
    policy = make_policy(name, budget=budget, interval=interval, **_knobs(name), **knobs)
    prompt = build_chat(loaded.tokenizer, SYSTEM, QUESTION)  # 56 protected tokens of 64
    settings = DecodeSettings(max_new_tokens=STEPS, stop_at_eos=False, prefill_chunk=32)
    run = Run(loaded, policy, prompt, settings, kv_quant=kv_quant)
    for _ in run.generate():
        pass
    return run.record


def _card(target: TargetModel, room: int) -> Projection:
    """A card with room for exactly ``room`` tokens of ``target``'s full-precision cache."""
    return Projection(target, (target.weights_bytes(4) + room * target.bytes_per_token) / GIB, 4)


TOY = TargetModel(
    "Toy", layers=1, q_heads=1, kv_heads=1, head_dim=256, hidden=8, intermediate=8, vocab=8, tied_embeddings=True
)


@pytest.mark.parametrize("name", policy_names())
def test_a_policy_reaching_its_budget_is_projected_at_its_cap(tiny_llama, name):
    # budget 24 < the 56 protected tokens: the cache is held at protected + sinks + recent
    record = _record(tiny_llama, name, budget=24)
    kept = np.array([e.kv_tokens for e in record.events])
    cap = kept_cap(record)
    cls = policy_class(name)
    if not cls.evicts or not cls.hard_budget:  # the full cache, think_drop: no cap
        assert cap is None
        return
    assert cap.protected == 56 and cap.interval == 4 and cap.forced > cap.budget
    end = int(tokens_seen(record)[-1])
    # what a step leaves is at most the cap less the token its forward read before compressing;
    # the engine's peak KV (read inside the forward) is the cap itself
    assert kept.max() == cap.at(end) - 1
    assert record.summary["peak_kv_bytes"] == cap.at(end) * tiny_llama.geometry.bytes_per_token or cls.fits_bias
    outcome = projection_outcome(record, ROOMY)
    assert outcome.reached and not outcome.grows and outcome.policy_oom is None
    assert outcome.kept_at(end + 10_000) == cap.at(end)
    note = outcome.notes()[-1]
    assert note.startswith(f"{name} holds at most {cap.at(end):,} tokens") and "not reached" not in note
    assert "grow" not in note and "run out" not in note
    # a card that holds less than the cap: it runs out where the cache reaches the card, never before
    room = int(kept.max()) - 2
    small = projection_outcome(record, _card(TOY, room))
    assert small.policy_oom is not None and small.policy_oom <= end


@pytest.mark.parametrize("name", policy_names())
def test_a_policy_short_of_its_budget_is_projected_up_to_its_cap(tiny_llama, name):
    # budget 400: the run (64 + 20 tokens) never reaches it
    record = _record(tiny_llama, name, budget=400)
    cap = kept_cap(record)
    end = int(tokens_seen(record)[-1])
    outcome = projection_outcome(record, ROOMY)
    if not policy_class(name).evicts or not policy_class(name).hard_budget:
        assert cap is None and outcome.kept_at(end + 100) == end + 100  # nothing evicted: it grows
        return
    assert cap.at(end) == 400 + 4 and not outcome.reached and not outcome.grows
    np.testing.assert_array_equal(outcome.kept_at(np.array([end, end + 100, end + 10_000])), [end, end + 100, 404])
    note = outcome.notes()[-1]
    assert note.startswith(f"{name} holds at most 404 tokens") and "not reached in this run" in note
    assert "grow" not in note and "run out" not in note
    # a budget above the card's capacity: it runs out where it would reach the card, on its way to its cap
    room = end + 50
    over = projection_outcome(record, _card(TOY, room))
    assert over.policy_oom == pytest.approx(room, abs=1)
    assert over.notes()[-1].startswith(f"{name}'s cap (404 tokens: budget 400, + 4 read between compressions)")


def test_ragged_and_per_layer_budgets_stay_within_the_cap_on_average(tiny_llama):
    # adakv shares a layer's budget over its heads, pyramidkv over its layers (the bottom one keeps
    # more than the budget, the top one less): the mean a token is priced at stays within the cap
    for name in ("adakv", "pyramidkv"):
        record = _record(tiny_llama, name, budget=40, interval=1, protect_system=False, protect_question=False)
        cap = kept_cap(record)
        assert cap.protected == 0 and cap.at(100) == 41
        assert max(e.kv_tokens for e in record.events) <= 40
        assert any(e.kept.max() > e.kept.min() for e in record.events)  # the layers or heads differ
    assert any(e.kept.max() > 40 for e in record.events)  # pyramidkv's bottom layer


def test_a_replayed_run_is_capped_without_the_steps_between_compressions(tiny_llama):
    record = replayed(tiny_llama, "h2o", budget=40, interval=3, recent=4).record
    cap = kept_cap(record)
    # each chunk of `interval` tokens is compressed in the step that reads it; only the trace's
    # shorter last chunk (if any) stays above what a compression keeps, by less than `interval`
    kept = [e.kv_tokens for e in record.events]
    assert cap.at(0) == 40 + 3 and max(kept[:-1]) == 40 and kept[-1] < cap.at(0)
    assert record.summary["peak_kv_bytes"] == cap.at(0) * tiny_llama.geometry.bytes_per_token


def test_a_fraction_budget_keeps_growing(tiny_llama):
    record = _record(tiny_llama, "h2o", budget=24, interval=1, budget_mode="fraction", budget_fraction=0.5)
    outcome = projection_outcome(record, ROOMY)
    assert outcome.grows and outcome.cap.fraction == 0.5
    assert outcome.notes()[-1] == "h2o keeps growing (50% of the tokens seen) but fits within the model's context"
    # on a card of 200 tokens the cap (half the tokens seen, + 1 read before each compression) passes it at 398
    assert projection_outcome(record, _card(TOY, 200)).policy_oom == pytest.approx(398)


def test_a_quantized_cache_is_capped_at_the_same_tokens_priced_in_its_format(tiny_llama_d32):
    q4 = KVQuant("q4_0")
    record = _record(tiny_llama_d32, "h2o", budget=400, kv_quant=q4)
    outcome = projection_outcome(record, ROOMY)
    assert outcome.policy == "h2o (q4_0)" and outcome.cap.at(0) == 404
    assert outcome.kept_bytes == ROOMY.kv_bytes(404, q4) < ROOMY.kv_bytes(404)
    assert outcome.notes()[-1].startswith("h2o (q4_0) holds at most 404 tokens")


def test_the_memory_chart_draws_the_cap_that_explains_the_kv_line(tiny_llama):
    record = _record(tiny_llama, "h2o", budget=24)
    names = [t.name for t in memory_figure(record).data]
    assert "budget (24 tokens)" in names
    assert (
        "cap (66 tokens: 62 kept by rule (56 protected + 6 recent) > budget 24, + 4 read between compressions)" in names
    )
    cap = next(t for t in memory_figure(record).data if t.name.startswith("cap"))
    per_token = tiny_llama.geometry.bytes_per_token
    assert max(record.kv_bytes_series()) == pytest.approx(cap.y[0] * 2**20 - per_token)  # the KV line's top
    assert record.summary["peak_kv_bytes"] == pytest.approx(cap.y[0] * 2**20)  # the peak KV is the cap
    # a budget the kept-by-rule tokens fit in: the budget explains the line, no second one
    roomy = replayed(tiny_llama, "h2o", budget=40, interval=3, recent=4).record
    assert not any(t.name.startswith("cap") for t in memory_figure(roomy).data)


# ---- one peak KV ----------------------------------------------------------------------
def _peak_everywhere(record) -> dict[str, str]:
    """The peak KV as the stats header, Compare's table and the memory chart show it."""
    chart = next(t.name for t in memory_figure(record).data if t.name.startswith("peak KV"))
    row = fidelity_row("h2o", None, None, record)
    return {
        "header": stats_strip(record)["peak KV"],
        "table": row[FIDELITY_COLUMNS.index("peak KV")],
        "chart": chart.removeprefix("peak KV ").split(" (")[0],
    }


def test_one_peak_kv_in_the_header_the_table_the_chart_and_a_recording(tiny_llama, tmp_path):
    run = Run(
        tiny_llama,
        make_policy("h2o", budget=40, interval=8, recent=4),
        build_chat(tiny_llama.tokenizer, "Be brief.", "Fix parse(s)."),
        DecodeSettings(),
    )
    for _ in run.replay(tiny_llama.tokenizer("Split on the colon. " * 12, add_special_tokens=False)["input_ids"]):
        pass
    record = run.record
    peak = peak_kv_bytes(record)
    assert peak == run.peak_kv_bytes > max(record.kv_bytes_series())  # read inside a step, before it compressed
    shown = _peak_everywhere(record)
    assert set(shown.values()) == {format_bytes(peak)}, shown
    record.save(tmp_path / "run")  # a recording keeps the same peak
    assert _peak_everywhere(RunRecord.load(tmp_path / "run")) == shown
    # while a run streams (no summary yet), every place shows the most held after a step
    streaming = dataclasses.replace(record, summary={})
    assert set(_peak_everywhere(streaming).values()) == {format_bytes(int(max(record.kv_bytes_series())))}


# ---- the loaded model -----------------------------------------------------------------
def test_the_live_chart_projects_the_loaded_model_on_its_own_config(tiny_llama):
    # tiny_llama: 2 layers, 4 query heads over 2 kv-heads (grouped-query), head size 16; a cache
    # priced in bf16 on a card: 2 (K, V) · 2 · 2 · 16 · 2 = 256 bytes a token (the embedded
    # SmolLM2's 30 layers of 3 kv-heads of 64: 23,040)
    record = _record(tiny_llama, "h2o", budget=24)
    session = Session(live_record=record)
    kept = np.array([e.kv_tokens for e in record.events])
    per_token = {}
    for loaded in (tiny_llama, tiny_model("llama", kv_heads=1)):  # the same model with one kv-head
        figure = reproject(SimpleNamespace(loaded=loaded), session, LOADED_TARGET, 8, False)
        assert f"Projected on {loaded.name} (4-bit weights), 8 GiB card (GiB)" in [
            a.text for a in figure.layout.annotations
        ]
        line = next(t for t in figure.data if t.name == f"policy on {loaded.name}")
        per_token[loaded.model.config.num_key_value_heads] = float(line.y[-1]) * GIB / kept[-1]
    assert per_token == {2: pytest.approx(256), 1: pytest.approx(128)}  # GQA: the kv-heads, not the query heads
    # no model loaded yet: no projection panel rather than another model's
    figure = reproject(SimpleNamespace(loaded=None), session, LOADED_TARGET, 8, False)
    assert not any(t.name.startswith("policy on") for t in figure.data)
