"""Sweeps that name a policy with its own knobs (tam:compaction=match) and report fit time."""

from __future__ import annotations

import pytest

from thinkviz.sweep.grid import Budget, check_params, markdown_table, parse_policies, split_policy, sweep_trace

from test_sweep_cli import TRACE


def test_a_policy_may_carry_its_own_knobs():
    assert split_policy("tam:compaction=match:ridge=0.5") == ("tam", {"compaction": "match", "ridge": "0.5"})
    assert split_policy("h2o") == ("h2o", {})
    specs = parse_policies("tam, tam:compaction=match,am,tam", variants=True)
    assert specs == ["tam", "tam:compaction=match", "am"]
    check_params(specs, {"l_min": 8})
    for bad, reason in [
        ("tam:compaction", "knob=value"),
        ("h2o:ridge=1", "h2o has no parameter ridge"),
        ("lru:x=1", "unknown policy 'lru'"),
    ]:
        with pytest.raises(ValueError, match=reason):
            parse_policies(bad, variants=True)
    with pytest.raises(ValueError, match="unknown policy"):
        parse_policies("tam:compaction=match")  # only where variants are allowed


def test_a_sweep_compares_two_settings_of_one_policy(tiny_llama):
    specs = ["tam", "tam:compaction=match", "am"]
    rows, replay = sweep_trace(
        tiny_llama, TRACE, specs, [Budget(0.5, True)], interval=8, params={"recent": 4, "window": 8}
    )
    assert [r["policy"] for r in rows] == ["full", *specs]
    assert [run.policy.config.get("compaction") for run in replay.runs] == ["select", "match", None]
    by_policy = {r["policy"]: r for r in rows}
    assert by_policy["tam"]["fit_seconds"] is None and by_policy["full"]["fit_seconds"] is None
    assert by_policy["tam:compaction=match"]["fit_seconds"] > 0 and by_policy["am"]["fit_seconds"] > 0
    assert "| tam:compaction=match |" in markdown_table(rows)
