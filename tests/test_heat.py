"""Heat a class can read: on recorded frames of every policy no frame is saturated, and a policy
without a graded score shows no heat at all."""

from __future__ import annotations

import numpy as np
import pytest

from thinkviz.text.chat import build_chat
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.policies import REFERENCE_POLICY, make_policy, policy_class, policy_names
from thinkviz.ui.controls import default_view
from thinkviz.ui.explore_views import token_data_at
from thinkviz.viz.tokens import HEAT_LEVELS, TokenData, heat_levels, render_tokens, token_view
from tiny_models import tiny_model

TOP_BAND_AT_MOST = 0.15


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama")


def recorded(loaded, name: str) -> tuple[Run, list]:
    """A run of ``name`` over a 40-token prompt and 100 generated tokens that evicts (budget 64),
    with the token view of each of its steps as the Live tab streams it."""
    values = {"budget": 64, "interval": 4} if name != REFERENCE_POLICY else {"interval": 4}
    run = Run(
        loaded,
        make_policy(name, **values),
        list(range(200, 240)),
        DecodeSettings(max_new_tokens=100, stop_at_eos=False, temperature=0.0),
    )
    return run, [token_view(run.record) for _ in run.generate()]


@pytest.mark.parametrize("name", policy_names())
def test_recorded_frames_of_every_policy_are_never_saturated(tiny, name):
    run, live = recorded(tiny, name)
    graded = policy_class(name).score_scale is not None
    assert default_view(name) == ("combined" if graded else "evicted")
    frames = live + [token_data_at(run.record, i)[0] for i in range(len(run.record.events))]
    if not graded:
        assert all(frame.scores is None for frame in frames)
        last = frames[-1]
        for mode in ("combined", "importance"):
            assert "tv-h" not in render_tokens(TokenData(last.texts, last.scores, last.keep_fraction), mode)
        return
    checked = 0
    for frame in frames:
        levels = heat_levels(frame.scores, len(frame.texts))
        scored = levels >= 0
        if scored.sum() < 40:
            continue
        checked += 1
        assert (levels[scored] == HEAT_LEVELS - 1).mean() <= TOP_BAND_AT_MOST
    assert checked >= len(frames) // 2
    assert np.unique(heat_levels(frames[-1].scores, len(frames[-1].texts))).size >= 5  # graded, not flat


def test_the_recent_window_is_not_ranked(tiny):
    run = Run(
        tiny,
        make_policy("h2o", budget=48, recent=8, interval=4),
        build_chat(tiny.tokenizer, "Be brief.", "What is 2+2?"),
        DecodeSettings(max_new_tokens=60, stop_at_eos=False),
    )
    list(run.generate())
    view = token_view(run.record)
    levels = heat_levels(view.scores, len(view.texts), view.ranked)
    assert (levels[-8:] == -1).all()  # the recent window is always kept: its score decides nothing
    assert (levels[:-8] >= 0).sum() > 40
    competing = levels[view.ranked]
    assert (competing[np.isfinite(np.asarray(view.scores)[view.ranked])] >= 0).all()
    assert (competing == HEAT_LEVELS - 1).mean() <= 0.15
    full = Run(
        tiny,
        make_policy("full"),
        build_chat(tiny.tokenizer, "Be brief.", "What is 2+2?"),
        DecodeSettings(max_new_tokens=4, stop_at_eos=False),
    )
    list(full.generate())
    assert token_view(full.record).ranked is None  # nothing is evicted: every token's attention is shown
