"""The token view: escaping, eviction marks, segment boxes, modes, and incremental patches."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkviz.text.chat import RoleSpan
from thinkviz.core.events import RunRecord, StepEvent
from thinkviz.text.segments import Segmenter
from thinkviz.viz.tokens import (
    HEAT_LEVELS,
    MODES,
    TOKEN_CSS,
    TOKEN_PATCH_JS,
    TokenData,
    heat_colour,
    heat_levels,
    keep_levels,
    render_tokens,
    token_delta,
    token_view,
    view_mode_choices,
)

OUR_ATTRS = {"class", "data-pos", "data-start", "data-heat", "title", "style"}


class _ViewParser(HTMLParser):
    """Reads our HTML back: the wrapper's attributes and every token's attributes and text.

    Records anything that is not one of our tags, so tests can assert nothing else appears.
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.view: dict[str, str] = {}
        self.tokens: list[dict[str, str]] = []
        self.foreign: list[str] = []
        self.stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag not in ("div", "span") or set(attrs) - OUR_ATTRS or self.stack[-1:] == ["span"]:
            self.foreign.append(tag)
        if tag == "div":
            self.view = attrs
        else:
            self.tokens.append(
                {
                    "cls": attrs.get("class", ""),
                    "style": attrs.get("style", ""),
                    "title": attrs.get("title", ""),
                    "pos": attrs.get("data-pos"),
                    "heat": attrs.get("data-heat"),
                    "text": "",
                }
            )
        self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.foreign.append(f"/{tag}")

    def handle_data(self, data):
        if self.stack[-1:] == ["span"]:
            self.tokens[-1]["text"] += data
        else:
            self.foreign.append(f"text:{data!r}")

    def handle_startendtag(self, tag, attrs):
        self.foreign.append(tag)

    def handle_comment(self, data):
        self.foreign.append("comment")

    def handle_decl(self, decl):
        self.foreign.append("decl")

    def handle_pi(self, data):
        self.foreign.append("pi")

    def unknown_decl(self, data):
        self.foreign.append("decl")


def parse(markup: str) -> _ViewParser:
    parser = _ViewParser()
    parser.feed(markup)
    parser.close()
    return parser


def tokens_of(markup: str) -> list[dict[str, str]]:
    parsed = parse(markup)
    assert parsed.foreign == []
    return parsed.tokens


def classes(token: dict[str, str]) -> set[str]:
    return set(token["cls"].split())


def chat_segmenter(assistant: list[str]) -> tuple[list[str], Segmenter]:
    """A real Segmenter over a small hand-made chat; returns all texts and the segmenter."""
    prompt = ["You", " are", " careful", "<|im_start|>", "user", " Fix", " it", "<think>", "\n"]
    roles = [RoleSpan("system", 0, 3), RoleSpan("user", 3, 7, 4, 7), RoleSpan("assistant", 7, 9, 7, None)]
    segmenter = Segmenter(roles, prompt, min_step_tokens=2)
    segmenter.feed(assistant)
    return prompt + assistant, segmenter


TWO_BLOCKS = ["Plan", " it", "</think>", "\n", "code", "<think>", "\n", "Check", " again"]


# ---- escaping -------------------------------------------------------------------------
def test_tags_in_text_show_as_text_and_never_as_markup():
    texts = ["<think>", "<script>window.pwned=1</script>", "a & b", 'say "hi"', "it's", "</span></div>"]
    markup = render_tokens(TokenData(texts, None, None, None, []), "importance")
    assert "&lt;think&gt;" in markup
    assert "<script" not in markup
    assert "&amp;" in markup
    tokens = tokens_of(markup)
    assert [t["text"] for t in tokens] == texts
    assert [json.loads(t["title"].split("  pos")[0]) for t in tokens] == texts  # quotes survive in titles


def test_newlines_are_kept_for_pre_wrap():
    markup = render_tokens(TokenData(["a", "\n\n", "b"], None, None, None, []), "segments")
    assert tokens_of(markup)[1]["text"] == "\n\n"
    assert "white-space: pre-wrap" in TOKEN_CSS


@settings(deadline=None)
@given(
    data=st.lists(
        st.tuples(
            st.text(alphabet=st.sampled_from(list("<>&\"'/= \nabc<think>")) | st.characters(), max_size=12),
            st.floats(allow_nan=True, allow_infinity=True, width=32),
            st.floats(min_value=0, max_value=1) | st.just(float("nan")),
        ),
        max_size=30,
    ),
    mode=st.sampled_from(MODES),
    start=st.integers(0, 50),
)
def test_fuzz_render_never_lets_input_become_markup(data, mode, start):
    texts = [d[0] for d in data]
    scores = np.array([d[1] for d in data], dtype=np.float32)
    keep = np.array([d[2] for d in data], dtype=np.float32)
    spans = [{"kind": "think", "index": 0, "start": start + 1, "end": start + 5, "closed": True, "protected": False}]
    markup = render_tokens(TokenData(texts, scores, keep, None, spans, start=start), mode)
    parsed = parse(markup)
    assert parsed.foreign == []
    assert [t["text"] for t in parsed.tokens] == texts
    assert [int(t["pos"]) for t in parsed.tokens] == list(range(start, start + len(texts)))


# ---- importance and eviction ---------------------------------------------------------------
def test_heat_uses_a_robust_maximum():
    scores = np.concatenate([np.arange(1, 101, dtype=float), [1e6]])
    levels = heat_levels(scores, len(scores))
    assert levels[99] == 9 and levels[100] == 9  # 100 is the 99th percentile; the outlier is clipped
    # (was 4 under the linear scale; #22 maps by rank) rank 49 of 100: q = 0.49, band 2 (0.447–0.548)
    assert levels[49] == 2  # an outlier does not wash it out
    assert levels[0] == 0


def test_heat_ranks_so_that_no_frame_saturates():
    rng = np.random.default_rng(0)
    for scores in (rng.exponential(size=2000), np.r_[np.zeros(1500), rng.random(500)], rng.random(2000) ** 8):
        levels = heat_levels(scores, len(scores))
        assert (levels == HEAT_LEVELS - 1).mean() <= 0.06
        assert (levels == 0).mean() >= 0.3  # most of the text stays light
    tied = np.r_[np.ones(600), np.arange(400.0) / 400]  # 60 % tie at the maximum
    assert heat_levels(tied, len(tied))[0] < HEAT_LEVELS - 1


def test_heat_among_neighbours_reads_the_same_at_every_age():
    rng = np.random.default_rng(1)
    ages = np.arange(2000.0)[::-1]
    for trend in (ages, 1 / (1 + ages)):  # accumulated attention favours the old, a per-query mean the young
        scores = trend * rng.lognormal(0, 0.5, 2000)
        whole, local = heat_levels(scores, 2000), heat_levels(scores, 2000, neighbours=64)
        assert min((whole[:150] >= 8).mean(), (whole[-150:] >= 8).mean()) == 0  # one end is never hot
        for stretch in (local[:150], local[-150:], local[900:1050]):
            assert 0.05 <= (stretch >= 8).mean() <= 0.2 and (stretch == 0).mean() >= 0.2
    assert list(heat_levels([3.0, 1.0, 2.0], 3, neighbours=64)) == list(heat_levels([3.0, 1.0, 2.0], 3))
    assert list(heat_levels([5.0, 1.0, 9.0, 2.0], 4, [True, False, True, True], neighbours=2)) == [0, -1, 9, 0]


def test_black_text_stays_readable_on_every_heat_colour():
    def luminance(colour: str) -> float:
        rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    for level in range(HEAT_LEVELS):
        assert (luminance(heat_colour(level)) + 0.05) / 0.05 >= 4.5  # WCAG AA against black
        assert f".tv-h{level} {{ background-color: {heat_colour(level)}; color: #000; }}" in TOKEN_CSS


def test_heat_without_scores_and_with_negatives():
    assert list(heat_levels([np.nan, np.inf, 1.0, 0.0], 4)) == [-1, -1, 9, 0]
    assert list(heat_levels(None, 2)) == [-1, -1]
    assert list(heat_levels([0.0, 0.0], 2)) == [0, 0]
    # (was [0, 5, 9] under the linear scale; #22 maps by rank) 0 is the middle rank: q = 0.5, band 2
    assert list(heat_levels([-1.0, 0.0, 1.0], 3)) == [0, 2, 9]


def test_keep_levels():
    assert list(keep_levels([0.0, 1.0, 0.5, 0.04, 0.97, np.nan], 6)) == [0, 10, 5, 1, 9, -1]


def test_evicted_and_partially_kept_tokens_are_marked():
    texts = ["kept", "gone", "half", "sliver"]
    keep = np.array([1.0, 0.0, 0.5, 1 / 12])
    scores = np.array([0.2, np.nan, 1.0, 0.1])
    for mode in ("evicted", "combined", "importance"):
        tokens = tokens_of(render_tokens(TokenData(texts, scores, keep, None, []), mode))
        assert "tv-gone" in classes(tokens[1])
        assert {"tv-part", "tv-k5"} <= classes(tokens[2])
        assert {"tv-part", "tv-k1"} <= classes(tokens[3])
        assert not classes(tokens[0]) & {"tv-gone", "tv-part"}
        assert "evicted from every layer and head" in tokens[1]["title"]
        assert "kept in 50% of layer×head slots" in tokens[2]["title"]
    segments_only = tokens_of(render_tokens(TokenData(texts, scores, keep, None, []), "segments"))
    assert not any(classes(t) & {"tv-gone", "tv-part"} for t in segments_only)
    assert ".tv-gone {" in TOKEN_CSS and "line-through" in TOKEN_CSS.split(".tv-gone {")[1].split("}")[0]


def test_tooltip_has_text_position_score_keep_and_segment():
    texts, seg = chat_segmenter(["Plan", " it"])
    n = len(texts)
    scores = np.linspace(0.0, 1.0, n)
    tokens = tokens_of(render_tokens(TokenData(texts, scores, np.ones(n), seg.labels(), seg.spans()), "combined"))
    title = tokens[9]["title"]
    assert title.startswith('"Plan"  pos 9\n')
    assert f"score {scores[9]:.3g}" in title
    assert "kept in every layer and head" in title
    assert "think 1 › step 1" in title
    assert "user 1 (template) · protected" in tokens[3]["title"]
    assert "tv-seg-template" in classes(tokens[3])


# ---- segments and think boxes ---------------------------------------------------------------
def test_segment_classes_and_think_boxes():
    texts, seg = chat_segmenter(TWO_BLOCKS)
    tokens = tokens_of(render_tokens(TokenData(texts, None, None, seg.labels(), seg.spans()), "segments"))
    by_text = {t["text"]: t for t in tokens}
    assert {"tv-seg-system", "tv-protected"} <= classes(tokens[0])
    assert {"tv-seg-user", "tv-protected"} <= classes(tokens[5])
    first_open, first_close = tokens[7], tokens[11]
    assert {"tv-think", "tv-tb0", "tv-think-start", "tv-seg-tag"} <= classes(first_open)
    assert first_open["style"] == "counter-reset: tv-think 1"
    assert {"tv-think", "tv-tb0", "tv-think-end"} <= classes(first_close)
    assert {"tv-think", "tv-seg-step"} <= classes(by_text["Plan"])
    assert not classes(by_text["code"]) & {"tv-think"}
    assert "tv-seg-answer" in classes(by_text["code"])
    second_open = tokens[14]
    assert {"tv-think-start", "tv-tb1"} <= classes(second_open)
    assert second_open["style"] == "counter-reset: tv-think 2"
    # the second block is still open: its last token draws no right edge yet
    assert "tv-think-end" not in classes(tokens[-1]) and "tv-think" in classes(tokens[-1])
    inner = [t for t in tokens[7:12]]
    assert all("tv-think" in classes(t) for t in inner)
    assert sum("tv-think-start" in classes(t) for t in tokens) == 2


def test_a_verified_think_block_carries_a_check_mark():
    texts, seg = chat_segmenter(TWO_BLOCKS)
    data = TokenData(texts, None, None, seg.labels(), seg.spans(), verified=frozenset({0}))
    starts = [t for t in tokens_of(render_tokens(data, "segments")) if "tv-think-start" in classes(t)]
    assert ["tv-think-ok" in classes(t) for t in starts] == [True, False]
    assert "tv-think-ok" not in render_tokens(TokenData(texts, None, None, seg.labels(), seg.spans()), "segments")
    assert ".tv-think-ok.tv-think-start::before" in TOKEN_CSS


def test_windowed_view_uses_absolute_positions():
    texts, seg = chat_segmenter(TWO_BLOCKS)
    window = texts[10:]
    view = TokenData(window, None, None, seg.labels()[10:], seg.spans(), start=10)
    tokens = tokens_of(render_tokens(view, "segments"))
    assert [int(t["pos"]) for t in tokens] == list(range(10, len(texts)))
    assert "tv-think-end" in classes(tokens[1])  # position 11 closes block 1
    assert not any("tv-think-start" in classes(t) and "tv-tb0" in classes(t) for t in tokens)


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_renders_its_own_classes(mode):
    texts, seg = chat_segmenter(TWO_BLOCKS)
    n = len(texts)
    keep = np.ones(n)
    keep[1] = 0.0
    markup = render_tokens(TokenData(texts, np.linspace(0, 1, n), keep, seg.labels(), seg.spans()), mode)
    parsed = parse(markup)
    assert parsed.foreign == []
    assert parsed.view["class"] == f"tv-view tv-mode-{mode}"
    found = set().union(*(classes(t) for t in parsed.tokens))
    assert any(c.startswith("tv-h") for c in found) == (mode in ("importance", "combined"))
    assert any(c.startswith("tv-seg-") for c in found) == (mode in ("segments", "combined"))
    assert ("tv-gone" in found) == (mode != "segments")
    assert ("tv-think" in found) == (mode != "importance")


@pytest.mark.parametrize("mode", MODES)
def test_empty_input(mode):
    markup = render_tokens(TokenData([], None, None, None, []), mode)
    parsed = parse(markup)
    assert parsed.foreign == [] and parsed.tokens == []
    assert parsed.view["class"] == f"tv-view tv-mode-{mode}"


def test_bad_input_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="unknown token view mode 'heat'"):
        render_tokens(TokenData(["a"], None, None, None, []), "heat")
    with pytest.raises(ValueError, match="scores has 2 entries for 1 tokens"):
        render_tokens(TokenData(["a"], [0.1, 0.2], None, None, []), "importance")


def test_unknown_span_kinds_are_ignored():
    spans = [{"kind": 'x" onmouseover="alert(1)', "index": 0, "start": 0, "end": 1}]
    tokens = tokens_of(render_tokens(TokenData(["a"], None, None, None, spans), "segments"))
    assert classes(tokens[0]) == {"tv-tok"}


# ---- incremental patches ---------------------------------------------------------------------
class SimulatedDom:
    """What the browser holds after applying patches the way TOKEN_PATCH_JS does."""

    def __init__(self) -> None:
        self.view: dict[str, str] = {}
        self.tokens: list[dict[str, str]] = []

    def apply(self, patch: dict) -> None:
        patch = json.loads(json.dumps(patch))  # what travels to the browser
        if patch["reset"] is not None:
            parsed = parse(patch["reset"])
            assert parsed.foreign == []
            self.view, self.tokens = parsed.view, parsed.tokens
        if patch["append"]:
            self.tokens += tokens_of(patch["append"])
        first = int(self.view["data-start"])
        for pos, change in patch["update"].items():
            token = self.tokens[int(pos) - first]
            token.update({k: v for k, v in change.items() if k in ("cls", "style", "title")})
            if "heat" in change:  # data-heat, removed by ""
                token["heat"] = change["heat"] or None

    def same_as(self, markup: str) -> bool:
        parsed = parse(markup)
        return parsed.view == self.view and parsed.tokens == self.tokens


def _frames():
    """A streaming run: tokens arrive one by one, scores shift, tokens get evicted, blocks open and close."""
    rng = np.random.default_rng(0)
    texts, seg = chat_segmenter([])
    stream = TWO_BLOCKS + ["</think>", "\n", "done", " <&>"]
    keep = list(np.ones(len(texts)))
    for step, piece in enumerate(stream):
        seg.feed([piece])
        texts = texts + [piece]
        keep.append(1.0)
        if step % 3 == 2:
            keep[int(rng.integers(9, len(keep)))] = 0.0
        if step % 4 == 1:
            keep[int(rng.integers(9, len(keep)))] = 0.5
        scores = rng.random(len(texts))
        scores[np.array(keep) == 0] = np.nan
        yield list(texts), scores, np.array(keep), seg.labels(), seg.spans()


@pytest.mark.parametrize("mode", MODES)
def test_patches_reproduce_the_full_render(mode):
    dom, state = SimulatedDom(), None
    resets = 0
    for texts, scores, keep, labels, spans in _frames():
        state, patch = token_delta(state, TokenData(texts, scores, keep, labels, spans), mode)
        resets += patch["reset"] is not None
        dom.apply(patch)
        assert dom.same_as(render_tokens(TokenData(texts, scores, keep, labels, spans), mode))
    assert resets == 1


def test_patch_sends_only_what_changed():
    texts, seg = chat_segmenter(["Plan"])
    n = len(texts)
    state, first = token_delta(None, TokenData(texts, np.ones(n), np.ones(n), seg.labels(), seg.spans()), "evicted")
    assert first["reset"] is not None
    seg.feed([" it"])
    keep = np.ones(n + 1)
    keep[2] = 0.0
    grown = TokenData(texts + [" it"], np.ones(n + 1), keep, seg.labels(), seg.spans())
    state, patch = token_delta(state, grown, "evicted")
    assert patch["reset"] is None
    assert tokens_of(patch["append"])[0]["text"] == " it"
    assert set(patch["update"]) == {2}
    assert set(patch["update"][2]) == {"cls", "title"}
    assert "tv-gone" in patch["update"][2]["cls"].split()
    state, same = token_delta(state, grown, "evicted")
    assert same == {"reset": None, "append": "", "update": {}}


def test_reset_on_mode_change_restart_and_new_window():
    texts, seg = chat_segmenter(["Plan"])
    args = (None, None, seg.labels(), seg.spans())
    state, _ = token_delta(None, TokenData(texts, *args), "segments")
    _, patch = token_delta(state, TokenData(texts, *args), "evicted")
    assert patch["reset"] is not None and "tv-mode-evicted" in patch["reset"]
    other = ["Different"] + texts[1:]
    _, patch = token_delta(state, TokenData(other, *args), "segments")
    assert patch["reset"] is not None
    _, patch = token_delta(state, TokenData(texts[:-1], None, None, seg.labels()[:-1], seg.spans()), "segments")
    assert patch["reset"] is not None
    _, patch = token_delta(state, TokenData(texts[2:], None, None, seg.labels()[2:], seg.spans(), start=2), "segments")
    assert patch["reset"] is not None and 'data-start="2"' in patch["reset"]


# ---- the patch script in a real browser -------------------------------------------------------
@pytest.fixture(scope="module")
def page(browser):
    page = browser.new_page()
    page.set_content(f"<style>{TOKEN_CSS}</style><div id='live'></div><div id='full'></div>")
    yield page
    page.close()


READ_VIEW = """(id) => {
  const view = document.getElementById(id).querySelector('.tv-view');
  return {view: [view.className, view.dataset.start],
          tokens: [...view.children].map(e => [e.dataset.pos, e.className, e.getAttribute('style') || '',
                                               e.title, e.textContent])};
}"""


@pytest.mark.browser
@pytest.mark.parametrize("mode", ["combined", "evicted"])
def test_patch_script_in_a_browser_matches_the_full_render(page, mode):
    state = None
    for i, (texts, scores, keep, labels, spans) in enumerate(_frames()):
        state, patch = token_delta(state, TokenData(texts, scores, keep, labels, spans), mode)
        # the script as a function expression (how the UI embeds it), fed objects or JSON strings
        page.evaluate(
            f"(p) => ({TOKEN_PATCH_JS})(document.getElementById('live'), p)", json.dumps(patch) if i % 2 else patch
        )
        page.evaluate(
            "(html) => { document.getElementById('full').innerHTML = html; }",
            render_tokens(TokenData(texts, scores, keep, labels, spans), mode),
        )
        assert page.evaluate(READ_VIEW, "live") == page.evaluate(READ_VIEW, "full")


@pytest.mark.browser
def test_browser_shows_tags_as_text_and_runs_no_injected_code(page):
    texts = [
        "<think>",
        "<script>window.pwned=1</script>",
        '<img src=x onerror="window.pwned=2">',
        "a & b",
        "gone",
        "half",
    ]
    keep = np.array([1, 1, 1, 1, 0.0, 0.5])
    scores = np.array([0.0, 0.1, 0.2, 1.0, np.nan, 0.5])
    page.evaluate(
        "(html) => { document.getElementById('full').innerHTML = html; }",
        render_tokens(TokenData(texts, scores, keep, None, []), "combined"),
    )
    page.wait_for_timeout(50)
    assert page.evaluate("() => window.pwned") is None
    shown = page.evaluate("() => [...document.querySelectorAll('#full .tv-tok')].map(e => e.textContent)")
    assert shown == texts
    style = page.evaluate("""() => {
      const q = (p) => getComputedStyle(document.querySelector(`#full [data-pos="${p}"]`));
      return {gone: q(4).textDecorationLine, half: q(5).opacity, hot: q(3).backgroundColor, cold: q(0).backgroundColor};
    }""")
    assert style["gone"] == "line-through"
    assert float(style["half"]) == pytest.approx(0.65)
    # (were rgb(200, 35, 30) and white; #22's palette keeps black text readable on the hottest colour)
    assert style["hot"] == "rgb(238, 80, 80)"
    assert style["cold"] == "rgb(255, 250, 240)"


def test_token_view_of_a_record_at_a_step():
    """One builder for a streaming run (the latest step) and a recording (any step)."""

    def event(step, text, n):
        return StepEvent(
            step=step,
            token_ids=[step],
            texts=[text],
            positions=[n - 1],
            scores=np.arange(n, dtype=np.float32),
            keep_fraction=np.ones(n, dtype=np.float32),
        )

    spans = [{"kind": "user", "index": 0, "start": 0, "end": 3, "closed": True, "protected": True}]
    record = RunRecord(
        meta={},
        prompt_ids=[1, 2, 3],
        prompt_texts=["<u>", "Hi", "</u>"],
        prompt_labels=["template", "user", "template"],
        segments=spans,
        events=[event(0, " a", 4), event(1, " b", 5)],
    )
    latest = token_view(record)
    assert list(latest.texts) == ["<u>", "Hi", "</u>", " a", " b"]
    np.testing.assert_array_equal(latest.scores, np.arange(5))
    assert latest.labels[:3] == ["template", "user", "template"] and latest.spans == spans
    first = token_view(record, 0)
    assert list(first.texts) == ["<u>", "Hi", "</u>", " a"] and len(first.scores) == 4
    before = token_view(RunRecord(meta={}, prompt_texts=["x"]))
    assert list(before.texts) == ["x"] and before.scores is None and before.labels is None
    tokens = tokens_of(render_tokens(latest, "segments"))
    assert "tv-seg-template" in classes(tokens[0]) and "tv-seg-template" not in classes(tokens[1])


def test_prediction_modes_take_their_heat_from_the_predictions_and_the_answer():
    def event(step, n, info):
        return StepEvent(
            step=step,
            token_ids=[step],
            texts=[" t"],
            positions=[n - 1],
            scores=np.zeros(n, dtype=np.float32),
            keep_fraction=np.ones(n, dtype=np.float32),
            info=info,
        )

    events = [
        event(0, 3, {"predicted": [1.0, 5.0, 2.0], "predicted_from": 0}),
        event(1, 4, {"predicted": [9.0], "predicted_from": 3}),
        event(2, 5, {"predicted": "junk", "predicted_from": 4}),
    ]  # a damaged entry is skipped
    record = RunRecord(
        meta={},
        prompt_ids=[1, 2],
        prompt_texts=["a", "b"],
        events=events,
        summary={"answer_attention": [0.1, 0.7, None, 0.2]},
    )
    view = token_view(record)
    np.testing.assert_array_equal(view.predicted[:4], [1.0, 5.0, 2.0, 9.0])
    assert np.isnan(view.predicted[4])
    np.testing.assert_array_equal(view.answer_attention[[0, 1, 3]], [0.1, 0.7, 0.2])
    assert np.isnan(view.answer_attention[[2, 4]]).all()
    assert token_view(record, 1).answer_attention is None  # 4 tokens: the answer has not begun
    hot = {
        mode: [t for t in tokens_of(render_tokens(view, mode)) if "tv-h9" in classes(t)]
        for mode in ("importance", "predicted", "answer")
    }
    assert hot["importance"] == []  # the policy's own scores are all zero
    assert [t["pos"] for t in hot["predicted"]] == ["3"] and [t["pos"] for t in hot["answer"]] == ["1"]
    assert (
        token_view(RunRecord(meta={}, prompt_texts=["x"], summary={"answer_attention": "junk"})).answer_attention
        is None
    )
    assert [m for _, m in view_mode_choices(False, fits_bias=True)] == list(MODES)
    assert [m for _, m in view_mode_choices(False, fits_bias=False)] == [m for m in MODES if m != "mass"]
    assert view_mode_choices(True, fits_bias=False)[-2:] == [
        ("predicted importance", "predicted"),
        ("attention from the answer", "answer"),
    ]
