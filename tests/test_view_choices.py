"""Which token views the pickers offer: the mass view only for a policy that fits attention biases,
the prediction modes only for one that predicts importance (Live by the policy and its knobs,
Explore by what the recorded run holds)."""

from __future__ import annotations

import threading

import pytest

from thinkviz.text.chat import build_chat
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.policies import make_policy
from thinkviz.ui import explore_views
from thinkviz.ui.tabs.compare import column_view_choices
from thinkviz.ui.tabs.live import view_choices


def modes(policy) -> list[str]:
    return [mode for _, mode in view_choices(policy)]


@pytest.mark.parametrize(
    "name, knobs, mass, predicted",
    [
        ("h2o", {}, False, False),
        ("tam", {}, False, False),
        ("tam", {"compaction": "match"}, True, False),
        ("am", {}, True, False),
        ("dynts", {}, False, True),
    ],
)
def test_live_offers_mass_only_for_a_policy_that_fits_biases(name, knobs, mass, predicted):
    offered = modes(make_policy(name, **knobs))
    assert ("mass" in offered) is mass
    assert ("predicted" in offered) is predicted and ("answer" in offered) is predicted
    assert {"importance", "segments", "evicted", "combined"} <= set(offered)


@pytest.mark.parametrize("name, mass", [("h2o", False), ("am", True)])
def test_explore_offers_mass_when_the_recorded_steps_carry_one(tiny_llama_d32, name, mass):
    prompt = build_chat(tiny_llama_d32.tokenizer, None, "Count to ten, slowly.")
    policy = make_policy(name, budget=16, recent=4, interval=4)
    run = Run(tiny_llama_d32, policy, prompt, DecodeSettings(max_new_tokens=24, stop_at_eos=False), threading.Event())
    for _ in run.generate():
        pass
    assert explore_views.fits_bias(run.record) is mass


def test_compare_offers_mass_when_a_checked_column_fits_biases():
    def offered(*names):
        return [mode for _, mode in column_view_choices([make_policy(name) for name in names])]

    assert "mass" not in offered("full", "window", "h2o")
    assert "mass" in offered("full", "h2o", "am")
    assert "predicted" not in offered("h2o", "dynts")  # the prediction modes are Live's and Explore's
