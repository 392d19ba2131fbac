"""Heat a class can read: on recorded frames of every policy no frame is saturated, the newest tokens
a class follows included; tokens kept by rule are drawn apart; a policy without a graded score shows
no heat at all."""

from __future__ import annotations

import numpy as np
import pytest

from thinkviz.text.chat import build_chat
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.core.events import RunRecord
from thinkviz.demos.recordings import load as load_recording, recording_path
from thinkviz.policies import REFERENCE_POLICY, make_policy, policy_class, policy_names
from thinkviz.ui.controls import default_view
from thinkviz.ui.explore_views import token_data_at
from thinkviz.viz.tokens import HEAT_LEVELS, TokenData, heat_levels, render_tokens, token_looks, token_view
from test_viz_tokens import tokens_of
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


def chatted(loaded, name: str, new: int, **values) -> RunRecord:
    """The record of ``name`` (with ``values``) generating ``new`` tokens after a short protected chat."""
    run = Run(
        loaded,
        make_policy(name, **values),
        build_chat(loaded.tokenizer, "Be brief.", "What is 2+2?"),
        DecodeSettings(max_new_tokens=new, stop_at_eos=False),
    )
    list(run.generate())
    return run.record


def test_tokens_kept_by_rule_are_drawn_apart_from_the_heat(tiny):
    record = chatted(tiny, "h2o", 60, budget=48, recent=8, interval=4)
    view = token_view(record)
    protected = [p for s in record.segments if s["protected"] for p in range(s["start"], s["end"])]
    assert protected and not view.ranked[protected].any()  # the protected prompt: kept whatever its score
    assert not view.ranked[-8:].any() and view.ranked.sum() >= 20  # so is the recent window
    tokens = tokens_of(render_tokens(view, "combined"))
    for token, ranked, score in zip(tokens, view.ranked, np.asarray(view.scores)):
        heat = [c for c in token["cls"].split() if c.startswith("tv-h")]
        if not ranked:
            assert "tv-rule" in token["cls"] and not heat and token["heat"] is None
        elif np.isfinite(score):  # a ranked token says its class, as the colour shows it
            assert heat == [f"tv-h{token['heat']}"] and 0 <= int(token["heat"]) < HEAT_LEVELS
        else:  # evicted: no score, no heat
            assert not heat and token["heat"] is None and "tv-rule" not in token["cls"]
    assert "data-heat" not in render_tokens(view, "segments")  # no heat shown, none said
    snapkv = chatted(tiny, "snapkv", 30, budget=48, window=8, interval=4)
    assert not token_view(snapkv).ranked[-8:].any()  # its observation window is its recent window
    full = chatted(tiny, "full", 4)
    assert token_view(full).ranked is None  # nothing is evicted: every token's attention is shown


# Recordings whose runs a class follows, with the policies the heat must stay readable for.
FOLLOWED = {"math_h2o_vs_window": ("h2o", "full"), "compare_lru_all": ("snapkv", "h2o"), "tam_math": ("tam", "h2o")}
VISIBLE = (150, 600)  # newest tokens on screen while following: about a Compare column, the Live view
HOT_AT_MOST = 0.4  # of the visible ranked tokens in the two hottest classes


@pytest.mark.parametrize("preset", FOLLOWED)
def test_following_the_newest_token_shows_readable_heat_on_recorded_frames(preset):
    """Played recordings (h2o's accumulated attention, snapkv's votes, tam's, the full cache's mean):
    ranked among the whole frame, 63–98 % of the newest 150 tokens were in the two hottest classes
    (or h2o's all in the coldest); ranked among tokens of comparable age, about 11 %."""
    recording = load_recording(recording_path(preset))
    seen = set()
    for record in recording.records:
        name = record.meta["policy"]
        if name not in FOLLOWED[preset] or name in seen:
            continue
        seen.add(name)
        events = len(record.events)
        for step in range(events // 4, events, max(1, events // 4)):
            looks = token_looks(token_view(record, step), "combined")  # data-heat is each look's heat
            for visible in VISIBLE:
                heat = np.array([int(look.heat) for look in looks[-visible:] if look.heat])
                assert len(heat) >= 20
                assert (heat >= HEAT_LEVELS - 2).mean() <= HOT_AT_MOST, (name, step, visible)
                assert np.unique(heat).size >= 5  # graded, not flat
    assert seen == set(FOLLOWED[preset])
