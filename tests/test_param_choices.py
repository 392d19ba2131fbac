"""Parameters with named choices: declared once, validated by ``coerce``, shown by every front end.

A test-only policy (:class:`ChoosyPolicy`, registered for the test only) declares one choice
knob; the CLI, the app's control pool and the Learn tab must all offer and check it.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from thinkviz.cli import main
from thinkviz.commands.common import policy_from_args
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.policies import Param, PolicyConfigError, make_policy
from thinkviz.policies.base import Policy
from thinkviz.policies.registry import POLICIES
from thinkviz.demos.presets import load_preset
from thinkviz.ui import controls
from thinkviz.ui.learn_cards import learn_markdown, policy_card


class ChoosyPolicy(Policy):
    """Keeps the newest or the oldest tokens, as its ``keep`` choice says (slot scores ``(L, H_kv, T)``)."""

    name = "choosy"
    summary = "Keep one end of the sequence, chosen by name."
    source = "tests only"
    params = (
        Param("keep", "newest", choices=("newest", "oldest"), help="which end of the sequence survives"),
        Param("recent", 4, 0, 64, 1, "newest tokens always kept"),
    )

    def score(self, view) -> torch.Tensor:
        positions = view.positions.float()
        return positions if self.keep == "newest" else -positions


@pytest.fixture
def choosy(monkeypatch):
    monkeypatch.setitem(POLICIES, ChoosyPolicy.name, ChoosyPolicy)
    return ChoosyPolicy


def test_a_choice_is_taken_by_name_and_anything_else_is_refused_with_the_choices():
    param = ChoosyPolicy.params[0]
    assert param.kind == "choice" and param.range_text == "newest / oldest"
    assert param.coerce("oldest") == "oldest" and param.coerce("  newest ") == "newest"
    for bad in ("middle", "", 1, None, True):
        with pytest.raises(PolicyConfigError, match="keep must be one of: newest, oldest"):
            param.coerce(bad)


def test_a_choice_declaration_must_be_consistent():
    with pytest.raises(ValueError, match="not one of its choices"):
        Param("mode", "fast", choices=("select", "match"), help="x")
    with pytest.raises(ValueError, match="choices go with a string default"):
        Param("mode", "fast", help="a string default needs its choices")
    with pytest.raises(ValueError, match="choices go with a string default"):
        Param("level", 1, 0, 4, 1, "numbers take ranges, not choices", choices=("1",))


def test_policies_take_and_check_their_choices(choosy):
    assert make_policy("choosy", budget=16).config["keep"] == "newest"
    assert make_policy("choosy", budget=16, keep="oldest").config["keep"] == "oldest"
    with pytest.raises(PolicyConfigError, match="keep must be one of: newest, oldest; got 'both'"):
        make_policy("choosy", budget=16, keep="both")


def _cli_args(*params: str) -> argparse.Namespace:
    return argparse.Namespace(
        policy="choosy",
        budget=32,
        budget_mode=None,
        budget_fraction=None,
        interval=1,
        no_protect_system=False,
        no_protect_question=False,
        param=[tuple(p.split("=", 1)) for p in params],
    )


def test_the_cli_takes_a_choice_by_name_and_refuses_others_in_one_line(choosy, capsys):
    assert policy_from_args(_cli_args("keep=oldest")).config["keep"] == "oldest"
    code = main(["generate", "--policy", "choosy", "--param", "keep=sideways", "What?"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert errors == ["thinkviz: error: keep must be one of: newest, oldest; got 'sideways'"]


def test_the_cli_lists_each_policys_choices(choosy, capsys):
    assert main(["policies", "choosy", "h2o"]) == 0
    out = capsys.readouterr().out
    assert "--param keep=newest" in out and "newest / oldest" in out and "which end of the sequence" in out
    assert "--param recent=32" in out and "0 – 1024" in out  # h2o's numeric knob, with its range
    assert "--budget N (256)" in out


def test_the_control_pool_has_a_dropdown_slot_for_a_choice(choosy):
    sizes = controls.pool_sizes()
    assert sizes.choices == 2  # as many as the policy with the most choice knobs: tam's compaction and reference
    assert controls.pool_choices(["choosy"]) == ["newest", "oldest"]
    assert {"newest", "oldest"} <= set(controls.pool_choices())  # beside the registered policies' choices
    specs = controls.slot_specs("choosy", sizes, {"keep": "oldest"})
    (choice,) = [s for s in specs.choices if s is not None]
    assert (choice.kind, choice.value, choice.choices, choice.label) == (
        "choice",
        "oldest",
        ("newest", "oldest"),
        "keep",
    )
    assert [s.name for s in specs.numbers if s is not None] == ["recent"]
    knorm = controls.slot_specs("knorm", sizes)  # (h2o has one since issue 36: normalize)
    assert knorm.choices == [None, None]  # hidden for a policy without choices
    values = controls.collect_params("choosy", controls.Pools([9], [], ["oldest"]))
    assert values == {"recent": 9, "keep": "oldest"}
    policy = controls.build_policy("choosy", values, budget=64, interval=1, protect_system=True, protect_question=True)
    assert policy.config["keep"] == "oldest"
    with pytest.raises(controls.ControlError, match="keep must be one of: newest, oldest"):
        controls.build_policy(
            "choosy", {"recent": 9, "keep": "both"}, budget=64, interval=1, protect_system=True, protect_question=True
        )


def test_the_learn_tab_lists_the_choices(choosy):
    card = policy_card("choosy")
    assert "| `keep` | newest | newest / oldest | which end of the sequence survives |" in card
    assert "### `choosy`" in learn_markdown()


def test_a_choice_changes_what_is_kept(tiny_llama, choosy):
    kept = {}
    for keep in ("newest", "oldest"):
        policy = make_policy("choosy", budget=16, recent=2, keep=keep)
        run = Run(tiny_llama, policy, list(range(100, 130)), DecodeSettings(max_new_tokens=4, stop_at_eos=False))
        events = list(run.generate())
        kept[keep] = events[-1].keep_fraction > 0
    assert kept["newest"][-10:].all() and not kept["newest"][:5].any()
    assert kept["oldest"][:5].all()


def test_a_preset_sets_a_choice_by_name_and_the_slots_show_it(choosy, tmp_path):
    (tmp_path / "pick.yaml").write_text(
        "title: Oldest first\nnotice: keeps the start\nmode: generate\npolicy: choosy\n"
        "params: {budget: 64, keep: oldest}\nquestion: Which end?\n",
        encoding="utf-8",
    )
    preset = load_preset("pick", directory=tmp_path)
    assert preset.params == {"budget": 64, "keep": "oldest"}
    assert make_policy(preset.policy, **preset.params).config["keep"] == "oldest"
    specs = controls.slot_specs(preset.policy, controls.pool_sizes(), preset.params)
    assert [s.value if s else None for s in specs.choices] == ["oldest", None]  # the second slot hidden
