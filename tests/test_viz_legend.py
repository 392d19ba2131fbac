"""The legend strip: the parts each view mode draws, a policy's own heat meaning, any other scale by data."""

from __future__ import annotations

import html
import re

import pytest

from thinkviz.policies import ScoreScale, policy_class, policy_names
from thinkviz.text.segments import Span
from thinkviz.viz.legend import PREDICTION_SCALES, legend_html, pin_host, view_kinds, view_legend
from thinkviz.viz.tokens import MODE_PARTS, MODES, PREDICTION_MODES, SEGMENT_KINDS, token_view

from viz_records import replayed

TITLES = {"heat": "Heat", "keep": "Cache:", "segments": "Segments:", "boxes": "Boxes:"}


def part_titles(markup: str) -> list[str]:
    return re.findall(r'<span class="tv-legend-part"><b>([^<]+)</b>', markup)


@pytest.mark.parametrize("mode", MODES)
def test_the_legend_explains_what_the_mode_draws_and_is_marked_up_as_a_legend(mode):
    scale = policy_class("h2o").score_scale
    markup = legend_html(mode, scale, policy="h2o")
    opening = f'<div class="tv-legend tv-mode-{mode}" role="note" aria-label="Legend: {mode} view of h2o">'
    assert markup.startswith(opening)
    assert part_titles(markup) == [TITLES[part] for part in MODE_PARTS[mode]]
    if "heat" in MODE_PARTS[mode]:
        assert scale.low in markup and scale.high in markup and markup.count("tv-legend-swatch") == 10
    if "keep" in MODE_PARTS[mode]:
        assert 'class="tv-tok tv-gone"' in markup and 'class="tv-tok tv-part tv-k5"' in markup
    assert MODE_PARTS["segments"] == ("segments", "boxes") and "heat" in MODE_PARTS["combined"]


def test_each_policy_gets_its_own_heat_meaning_or_says_it_has_none():
    for name in policy_names():
        scale = policy_class(name).score_scale
        markup = legend_html("importance", scale, policy=name)
        if scale is None:
            assert f"No heat:</b> {name} keeps tokens by a rule" in markup and "tv-h" not in markup
        else:
            assert scale.what.replace("'", "&#x27;") in markup


def test_a_new_heat_mode_is_explained_by_its_scale_alone():
    mass = ScoreScale("segment mass e^β <from TAM>", "light segment", "heavy segment")
    markup = legend_html("combined", mass, policy="tam")
    assert "segment mass e^β &lt;from TAM&gt;" in markup and "heavy segment" in markup


@pytest.mark.parametrize("mode", PREDICTION_MODES)
def test_a_prediction_mode_explains_its_own_heat_over_every_token(mode):
    markup = view_legend(mode, "dynts", None)
    assert part_titles(markup) == ["Heat", "Cache:"] and MODE_PARTS[mode] == ("heat", "keep")
    scale = PREDICTION_SCALES[mode]
    assert scale.what.replace("'", "&#x27;") in markup and scale.high in markup
    assert policy_class("dynts").score_scale.what not in markup and "recent window" not in markup
    assert "recent window" in view_legend("importance", "dynts", None)


def test_the_heat_legend_says_which_score_ranked_the_tokens(tiny_llama):
    view = token_view(replayed(tiny_llama, "dynts", recent=4).record)  # no predictor: the fallback
    assert view.ranked_by.startswith("attention fallback: no predictor trained for tiny-llama")
    said = f"ranked by: {html.escape(view.ranked_by)}"
    assert said in view_legend("importance", "dynts", view)
    assert said in view_legend("combined", "dynts", view, ("heat",), compact=True)  # a Compare column
    for mode in ("mass", *PREDICTION_MODES):  # another heat than the policy's own score
        assert "ranked by" not in view_legend(mode, "dynts", view)
    assert token_view(replayed(tiny_llama, "h2o", recent=4).record).ranked_by is None  # h2o does not say


def test_segment_samples_follow_the_kinds_the_view_shows():
    markup = legend_html("segments", None, kinds=["user", "think", "quux"])
    assert "tv-seg-user" in markup and "think block" in markup and "quux" in markup
    assert "tv-seg-code" not in markup
    every = legend_html("segments", None)
    assert all(f"tv-seg-{kind}" in every for kind in SEGMENT_KINDS)
    spans = [Span("user", 0, 0, 4, True, True), {"kind": "think", "start": 4, "end": 9}]
    assert view_kinds(spans, ["template", "user"]) == ["user", "think", "template"]
    assert legend_html("combined", None, parts=("heat",)).count("tv-legend-part") == 1
    assert legend_html("segments", None, parts=("heat",)) == ""


def test_the_boxes_explain_the_verified_mark_only_where_the_view_marks_blocks():
    assert "tv-think-ok" in legend_html("segments", None, verified=True)
    assert "tv-think-ok" not in legend_html("segments", None)


def test_the_pin_box_sits_over_the_view_it_pins_from():
    markup = pin_host("live", '<div id="x" class="tv-container"></div>')
    assert markup.index('class="tv-pin"') < markup.index('class="tv-container"')
    assert 'data-pin-key="live"' in markup
    with pytest.raises(ValueError, match="unknown token view mode"):
        legend_html("heat", None)


def test_the_heat_legend_says_how_tokens_are_ranked_and_which_are_kept_by_rule():
    h2o = view_legend("combined", "h2o", None)
    assert "nearest in age" in h2o and '<span class="tv-tok tv-rule">kept by rule</span>' in h2o
    assert "nearest in age" in view_legend("combined", "h2o", None, ("heat",), compact=True)
    full = view_legend("combined", "full", None)  # keeps every token: none by rule
    assert "nearest in age" in full and "tv-rule" not in full
    for mode in ("mass", *PREDICTION_MODES):  # ranked over the whole frame, every token
        markup = view_legend(mode, "dynts", None)
        assert "top 5 % of this frame" in markup and "tv-rule" not in markup and "nearest in age" not in markup
