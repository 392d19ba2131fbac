"""Every shipped preset runs what it says: the controls it fills, the policies built from them and
the recordings' params carry the preset's knobs, in Live, Compare and Sweep (through the UI's functions)."""

from __future__ import annotations

import gradio as gr
import pytest

from thinkviz.text.chat import build_chat
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.policies import policy_params
from thinkviz.demos.presets import list_presets, load_preset
from thinkviz.measure.replay import load_trace
from thinkviz.sweep.grid import Budget, sweep_trace
from thinkviz.ui import controls
from thinkviz.measure.comparison import preset_policies
from thinkviz.ui.sweep_run import SweepPreset
from thinkviz.ui.tabs.compare import policy_set_controls
from thinkviz.ui.tabs.sweep import PROTECTION
from thinkviz.ui.widgets import policy_controls
from tiny_models import tiny_model

PRESETS = list_presets()


@pytest.fixture(scope="module")
def groups():
    with gr.Blocks():
        return policy_controls("h2o"), policy_set_controls()


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama")


def shown(value):
    """What a control shows after a handler returned ``value`` (a plain value or a ``gr.update``)."""
    return value.get("value") if isinstance(value, dict) else value


def declared(name: str, params: dict) -> dict:
    names = {p.name for p in policy_params(name)}
    return {key: value for key, value in params.items() if key in names}


def recorded_params(loaded, policy) -> dict:
    run = Run(
        loaded,
        policy,
        build_chat(loaded.tokenizer, None, "Why is the sky blue?"),
        DecodeSettings(max_new_tokens=2, stop_at_eos=False),
    )
    list(run.generate())
    return run.record.meta["params"]


@pytest.mark.parametrize("name", PRESETS)
def test_live_controls_show_and_run_the_presets_knobs(name, groups, tiny):
    preset = load_preset(name)
    live, _ = groups
    values = [shown(v) for v in live.preset_values(preset.policy, preset.params)]
    assert values[0] == preset.policy
    specs = controls.slot_specs(preset.policy, controls.pool_sizes())  # which parameter each slot shows
    names = [spec.name if spec else None for pool in specs for spec in pool]
    slots = {name: v for name, v in zip(names, values[1 + len(live.common.inputs()) :]) if name}
    assert set(slots) == {p.name for p in controls.own_params(preset.policy)}
    for key, value in preset.params.items():
        if key in slots:
            assert slots[key] == value, key
    policy = live.make(values)
    assert policy.name == preset.policy
    assert {key: policy.config[key] for key in preset.params} == preset.params
    params = recorded_params(tiny, policy)
    assert {key: params[key] for key in preset.params} == preset.params


@pytest.mark.parametrize("name", PRESETS)
def test_every_compared_policy_gets_the_knobs_it_declares(name, groups, tiny):
    preset = load_preset(name)
    _, compare = groups
    names, _, _ = preset_policies(preset)
    values = [*compare.preset_values(preset, names), True]
    policies, _ = compare.make(values)
    assert [p.name for p in policies] == names
    for policy in policies:
        assert {key: policy.config[key] for key in declared(policy.name, preset.params)} == declared(
            policy.name, preset.params
        )
    params = recorded_params(tiny, policies[-1])
    assert {key: params[key] for key in declared(policies[-1].name, preset.params)} == declared(
        policies[-1].name, preset.params
    )


@pytest.mark.parametrize("name", [n for n in PRESETS if load_preset(n).mode == "replay"])
def test_a_sweep_of_a_replay_preset_runs_its_policies_with_its_knobs(name, tiny):
    preset = load_preset(name)
    chosen = SweepPreset.of(preset)
    assert chosen.policies and chosen.interval == preset.params["interval"]
    knobs = controls.parse_knobs(controls.format_knobs(chosen.params), chosen.policies)
    params = {**knobs, **{key: chosen.params.get(key, True) for key in PROTECTION}}
    budgets = [Budget(preset.params["budget"], False)]
    rows, replay = sweep_trace(
        tiny, load_trace(name), chosen.policies, budgets, chosen.interval, params, max_trace_tokens=4
    )
    assert [row["policy"] for row in rows[1:]] == chosen.policies
    for policy, run in zip(chosen.policies, replay.runs):
        wanted = {k: v for k, v in declared(policy, preset.params).items() if k not in ("budget",)}
        assert {key: run.record.meta["params"][key] for key in wanted} == wanted


def test_the_knob_box_refuses_what_no_chosen_policy_takes_and_malformed_entries():
    assert controls.parse_knobs(" recent = 64 ,window=32,", ["h2o", "tam"]) == {"recent": "64", "window": "32"}
    assert controls.knobs_for("h2o", {"recent": "64", "window": "32"}) == {"recent": "64"}
    with pytest.raises(controls.ControlError, match="l_min"):
        controls.parse_knobs("l_min=16", ["h2o", "window"])
    with pytest.raises(controls.ControlError, match="name=value"):
        controls.parse_knobs("recent 64", ["h2o"])
    assert (
        controls.format_knobs({"budget": 8, "recent": 64, "flag": True, "mode": "match"})
        == "recent=64, flag=true, mode=match"
    )
