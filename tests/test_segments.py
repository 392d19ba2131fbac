"""Segmenter: spans, labels, protection and code_after — examples, edge cases and fuzzing."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkviz.models.loading import embedded_tokenizer
from thinkviz.policies.think_drop import code_parses
from thinkviz.text.chat import REASONING_SYSTEM_PROMPT, RoleSpan, anchor, build_chat, token_texts
from thinkviz.text.segments import Segmenter, Span, signature_ranges


def text_of(texts: list[str], span: Span) -> str:
    return "".join(texts[span.start : span.end])


def of_kind(segmenter: Segmenter, kind: str) -> list[Span]:
    return [s for s in segmenter.spans() if s.kind == kind]


def snapshot(segmenter: Segmenter) -> tuple:
    """Everything observable, for incremental-vs-batch comparisons."""
    return (
        segmenter.n_tokens,
        segmenter.spans(),
        segmenter.labels(),
        segmenter.protected_mask().tolist(),
        [segmenter.code_after(b) for b in segmenter.think_blocks()],
    )


# A small chat in hand-made tokens: system, user (with code), assistant prefix.
PROMPT = [
    "<|im_start|>", "system", "\n", "Think", " first", ".", "<|im_end|>", "\n",
    "<|im_start|>", "user", "\n", "Fix", ":\n", "```", "python", "\n", "def", " area", "(r", "):",
    "\n", "    ", "return", " r", "\n", "```", "<|im_end|>", "\n",
    "<|im_start|>", "assistant", "\n", "<think>", "\n",
]  # fmt: skip
ROLES = [
    RoleSpan("system", 0, 8, 3, 6),
    RoleSpan("user", 8, 28, 11, 26),
    RoleSpan("assistant", 28, 33, 31, None),
]


def chat(**kwargs) -> Segmenter:
    return Segmenter(ROLES, PROMPT, **kwargs)


# ---- the prompt ----------------------------------------------------------------------------
def test_prompt_labels_roles_markers_and_signature():
    seg = chat()
    labels = seg.labels()
    assert labels[:8] == ["template"] * 3 + ["system"] * 3 + ["template"] * 2
    assert labels[11:16] == ["user"] * 5
    (signature,) = of_kind(seg, "signature")
    assert text_of(PROMPT, signature) == "def area(r):" and signature.protected
    assert labels[signature.start : signature.end] == ["signature"] * 4
    assert labels[28:31] == ["template"] * 3  # the assistant header
    assert labels[31:33] == ["tag", "think"]
    system, user = of_kind(seg, "system") + of_kind(seg, "user")
    assert (system.start, system.end, user.start, user.end) == (0, 8, 8, 28)


@pytest.mark.parametrize("protect_system", [True, False])
@pytest.mark.parametrize("protect_question", [True, False])
def test_protection_toggles_and_signature_always(protect_system, protect_question):
    seg = chat(protect_system=protect_system, protect_question=protect_question)
    mask = seg.protected_mask()
    assert mask.shape == (seg.n_tokens,) and mask.dtype == bool
    assert mask[:8].all() == protect_system and mask[:8].any() == protect_system
    signature = of_kind(seg, "signature")[0]
    assert mask[signature.start : signature.end].all()
    outside_signature = np.r_[8 : signature.start, signature.end : 28]
    question = mask[outside_signature]
    assert question.all() == protect_question and question.any() == protect_question
    assert not mask[28:].any()


def test_signature_ranges():
    code = (
        "Here:\n"
        "class Shape(Base,\n          Mixin):\n"
        "    async def area(self, r: float = f(1)) -> dict[str, int]:\n"
        "        return 1\n"
        "define things: not code\n"
        "def broken(x\n"
        "class Foo:\n"
        "    def g(self): pass\n"
    )
    found = [code[a:b] for a, b in signature_ranges(code)]
    assert found == [
        "class Shape(Base,\n          Mixin):",
        "async def area(self, r: float = f(1)) -> dict[str, int]:",
        "class Foo:",
        "def g(self):",
    ]


def test_roles_are_validated():
    with pytest.raises(ValueError, match="last"):
        Segmenter([RoleSpan("assistant", 0, 1), RoleSpan("user", 1, 2)], ["a", "b"])
    with pytest.raises(ValueError, match="out of order"):
        Segmenter([RoleSpan("user", 2, 3), RoleSpan("system", 0, 1)], ["a", "b", "c"])
    with pytest.raises(ValueError, match="beyond"):
        Segmenter([RoleSpan("user", 0, 5)], ["a"])
    with pytest.raises(ValueError, match="unknown role"):
        Segmenter([RoleSpan("bot", 0, 1)], ["a"])  # "tool" became a role with transcripts (#14)


# ---- think blocks, steps, code -------------------------------------------------------------
REFLECTION = [
    "First", " draft", " of", " the", " idea", " here", ".", "\n\n",
    "Then", " check", ":", "\n", "```", "py", "\n", "x", " =", " 1", "\n\n", "y", "\n", "```", "\n",
    " </", "think", ">", "\n\n", "```", "python", "\n", "def", " area", "(r", "):", " return", " 3", "\n", "```", "\n",
    "<th", "ink", ">", "\n", "Looks", " fine", ".", "</think>", "Done", ".",
]  # fmt: skip


def test_reflection_loops_steps_code_and_tags():
    seg = chat(min_step_tokens=2)
    seg.feed(REFLECTION)
    texts = PROMPT + REFLECTION
    first, second = seg.think_blocks()
    assert (first.index, first.closed, second.index, second.closed) == (0, True, 1, True)
    assert text_of(texts, first).startswith("<think>\nFirst") and text_of(texts, first).endswith(" </think>")
    assert text_of(texts, second) == "<think>\nLooks fine.</think>"
    tags = [text_of(texts, t) for t in of_kind(seg, "tag")]
    assert tags == ["<think>", " </think>", "<think>", "</think>"]
    assert [t.parent for t in of_kind(seg, "tag")] == [0, 0, 1, 1]
    steps = of_kind(seg, "step")
    assert [(s.parent, s.index) for s in steps] == [(0, 0), (0, 1), (1, 0)]
    assert text_of(texts, steps[0]) == "\nFirst draft of the idea here.\n\n"  # "\n\n" stays with its step
    assert text_of(texts, steps[1]).startswith("Then check") and "y\n```" in text_of(texts, steps[1])
    think_code, answer_code = of_kind(seg, "code")
    assert think_code.inside_think and think_code.parent == 0 and think_code.closed
    assert not answer_code.inside_think and answer_code.parent is None
    assert text_of(texts, answer_code) == "```python\ndef area(r): return 3\n```"
    answers = [text_of(texts, a) for a in of_kind(seg, "answer")]
    assert answers == ["\n\n```python\ndef area(r): return 3\n```\n", "Done."]
    assert seg.code_after(first) == "def area(r): return 3\n"
    assert code_parses(seg.code_after(first))
    assert seg.code_after(second) is None  # "Done." is not complete until the turn ends
    seg.finish()
    assert seg.code_after(second) == "Done."
    labels = seg.labels()
    assert labels[33 + REFLECTION.index("x")] == "code"
    assert labels[33 + REFLECTION.index(" </") : 33 + REFLECTION.index(" </") + 3] == ["tag"] * 3
    assert labels[-2:] == ["answer", "answer"]


def test_spans_sorted_and_nested():
    seg = chat(min_step_tokens=2)
    seg.feed(REFLECTION)
    spans = seg.spans()
    assert spans == sorted(spans, key=lambda s: s.start)
    blocks = seg.think_blocks()
    for span in spans:
        if span.kind in ("step", "tag") or (span.kind == "code" and span.inside_think):
            block = blocks[span.parent]
            assert block.start <= span.start <= span.end <= block.end


def test_steps_merge_short_ones_into_the_previous():
    texts = ["<think>", "a", "\n\n", "b", "b", "b", "\n\n", "c", "\n\n", "d", "d", "d", "</think>"]
    seg = Segmenter([], texts, min_step_tokens=3)
    steps = [text_of(texts, s) for s in of_kind(seg, "step")]
    # "a\n\n" (2 tokens) is first: it joins the next; "c\n\n" joins the previous
    assert steps == ["a\n\nbbb\n\nc\n\n", "ddd"]
    assert [s.index for s in of_kind(seg, "step")] == [0, 1]
    every = Segmenter([], texts, min_step_tokens=0)
    assert [text_of(texts, s) for s in of_kind(every, "step")] == ["a\n\n", "bbb\n\n", "c\n\n", "ddd"]


def test_blank_lines_inside_thinking_code_do_not_split_steps():
    texts = ["<think>", "```", "\n", "a", "\n\n", "b", "\n", "```", "</think>"]
    seg = Segmenter([], texts, min_step_tokens=0)
    assert len(of_kind(seg, "step")) == 1


def test_long_blank_line_split_across_feeds():
    seg = Segmenter([], ["<think>", "a", "\n", " " * 20], min_step_tokens=0)
    seg.feed(["\n"])
    seg.feed(["b"])
    assert len(of_kind(seg, "step")) == 2


def test_open_step_and_block_while_streaming():
    seg = Segmenter([], ["<think>", "\n", "one", " two"], min_step_tokens=1)
    (block,) = seg.think_blocks()
    assert not block.closed and block.end == 4
    assert of_kind(seg, "step")[-1].closed is False
    assert seg.code_after(block) is None


# ---- boundaries: tags split across tokens, straddling tokens --------------------------------
def test_synthetic_split_tags():
    texts = ["<th", "ink>", "\n", "idea", "</", "think", ">", "ok"]
    seg = Segmenter([], texts)
    (block,) = seg.think_blocks()
    assert (block.start, block.end, block.closed) == (0, 7, True)
    assert [text_of(texts, t) for t in of_kind(seg, "tag")] == ["<think>", "</think>"]
    assert seg.labels() == ["tag", "tag", "think", "think", "tag", "tag", "tag", "answer"]


def test_straddling_tokens_go_where_their_visible_text_starts():
    texts = ["x<th", "ink>", "a", " </", "think>\n", "\n\nNext"]
    seg = Segmenter([], texts)
    (block,) = seg.think_blocks()
    # "x<th" starts with answer text: it is answer; the tag starts at "ink>"
    assert (block.start, block.end) == (1, 5)
    assert seg.labels() == ["answer", "tag", "think", "tag", "tag", "answer"]
    steps_texts = ["<think>", "one", "\n\n", "two", " \n\n Three", "</think>"]
    steps = of_kind(Segmenter([], steps_texts, min_step_tokens=0), "step")
    assert [text_of(steps_texts, s) for s in steps] == ["one\n\n", "two", " \n\n Three"]


def test_real_tokenizer_splits_tags_and_segments_them():
    tok = embedded_tokenizer()
    question = "Fix:\n```python\ndef area(r: float) -> float:\n    return 2*r\n```"
    prompt = build_chat(tok, REASONING_SYSTEM_PROMPT, question)
    generated = (
        "The area of a circle is pi r squared.\n\nSo return math.pi * r ** 2 here. </think>\n\n"
        "```python\nimport math\n\ndef area(r: float) -> float:\n    return math.pi * r ** 2\n```\n"
        "<think>\nCheck: area(1) is pi. Good 😀.\n</think>\nDone."
    )
    ids = tok(generated, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids).count("think") == 3  # "<think>" arrives as "<", "think", ">"
    seg = Segmenter(prompt.roles, prompt.texts, min_step_tokens=4)
    texts = list(prompt.texts)
    for i in range(len(ids)):  # stream one token at a time, decoded like the engine does
        piece = token_texts(tok, ids[i : i + 1], prefix_ids=(prompt.ids + ids)[: len(prompt.ids) + i][-8:])
        texts += piece
        seg.feed(piece)
    assert "".join(texts) == prompt.text + generated
    first, second = seg.think_blocks()
    assert text_of(texts, first).startswith("<think>\nThe area")
    assert text_of(texts, first).endswith(" </think>")
    assert [text_of(texts, t) for t in of_kind(seg, "tag")] == ["<think>", " </think>", "<think>", "</think>"]
    assert len([s for s in of_kind(seg, "step") if s.parent == 0]) == 2
    code = seg.code_after(first)
    assert code.startswith("import math") and code_parses(code)
    (signature,) = of_kind(seg, "signature")
    assert text_of(texts, signature) == "def area(r: float) -> float:"
    assert seg.labels()[: prompt.roles[-1].start].count("signature") == signature.end - signature.start
    batch = Segmenter(prompt.roles, texts, min_step_tokens=4)
    assert snapshot(batch) == snapshot(seg)


# ---- edge cases ----------------------------------------------------------------------------
def test_nested_open_tag_is_text():
    texts = ["<think>", "a", "<think>", "b", "</think>", "c"]
    seg = Segmenter([], texts)
    (block,) = seg.think_blocks()
    assert (block.start, block.end) == (0, 5)
    assert seg.labels() == ["tag", "think", "think", "think", "tag", "answer"]


def test_unclosed_think_block_stays_open():
    seg = Segmenter([], ["<think>", "never", " closed", "```", "py"])
    (block,) = seg.think_blocks()
    assert not block.closed and block.end == seg.n_tokens
    (code,) = of_kind(seg, "code")
    assert code.inside_think and not code.closed
    seg.finish()
    assert not seg.think_blocks()[0].closed and seg.code_after(seg.think_blocks()[0]) is None


def test_stray_close_tag_is_answer_text():
    seg = Segmenter([], ["ok", "</think>", " fine"])
    assert seg.think_blocks() == [] and seg.labels() == ["answer"] * 3


def test_no_tags_is_all_answer():
    seg = Segmenter([], ["def", " f", "():", " pass"])
    assert seg.labels() == ["answer"] * 4
    assert [s.kind for s in seg.spans()] == ["answer"]


@pytest.mark.parametrize("texts", [[], [""], [" "], ["\n", "\n\n", " \t"], ["", "", ""]])
def test_empty_and_whitespace_only(texts):
    seg = Segmenter([], texts)
    assert seg.n_tokens == len(texts) and len(seg.labels()) == len(texts)
    assert seg.think_blocks() == []
    assert all(0 <= s.start < s.end <= len(texts) for s in seg.spans())


def test_unicode_texts():
    texts = ["<think>", "日本", "語", "😀", "", " e\u0301", "\n\n", "한국어", "</think>", "ñ"]
    seg = Segmenter([], texts, min_step_tokens=1)
    assert [text_of(texts, s) for s in of_kind(seg, "step")] == ["日本語😀 e\u0301\n\n", "한국어"]
    assert seg.labels()[-1] == "answer"


def test_tag_ends_an_open_fence():
    texts = ["<think>", "```", "\n", "x", "</think>", "```", "py", "\n", "y=1", "<think>", "z"]
    seg = Segmenter([], texts)
    inner, outer = of_kind(seg, "code")
    assert (inner.start, inner.end, inner.closed) == (1, 4, False)
    assert (outer.start, outer.end, outer.closed) == (5, 9, False)
    assert seg.code_after(seg.think_blocks()[0]) == "y=1"  # the next block started: complete


def test_code_after_waits_for_completion():
    seg = Segmenter([], ["<think>", "plan", "</think>", "\n"])
    block = seg.think_blocks()[0]
    assert seg.code_after(block) is None  # nothing yet
    seg.feed(["```python", "\n", "x = (", "\n"])
    assert seg.code_after(block) is None  # fence still open
    seg.feed(["```"])
    assert seg.code_after(block) == "x = (\n"  # complete, even if it will not parse
    ws = Segmenter([], ["<think>", "a", "</think>", "\n\n"])
    ws.finish()
    assert ws.code_after(ws.think_blocks()[0]) is None  # whitespace is no code


def test_unfenced_answer_is_the_code_once_complete():
    seg = Segmenter([], ["<think>", "a", "</think>", "x = 1", "\n"])
    block = seg.think_blocks()[0]
    assert seg.code_after(block) is None
    seg.feed(["<think>"])
    assert seg.code_after(block) == "x = 1\n"


def test_feed_cost_does_not_grow_with_length():
    seg = Segmenter([], ["<think>"])
    start = time.perf_counter()
    for _ in range(30_000):
        seg.feed([" word"])
    seg.feed(["</think>"])
    for _ in range(30_000):
        seg.feed([" prose"])
    assert time.perf_counter() - start < 5.0  # quadratic re-scanning would take minutes
    assert seg.n_tokens == 60_002 and seg.think_blocks()[0].closed


# ---- fuzzing: incremental == batch, invariants, an independent reference ----------------------
FRAGMENTS = [
    "<think>", "</think>", "<th", "ink>", "</", "think", ">", "```", "```python\n", "`", "\n", "\n\n",
    " \n \n", "  ", "\t", "        ", "word", " step.", "def f(x):", "class A:", "😀", "日本語", "e\u0301", "한", "x=1",
]  # fmt: skip
fragments = st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)


@st.composite
def tokens(draw, text: str) -> list[str]:
    """Split ``text`` into token texts at random character offsets (empty tokens allowed)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=len(text) + 3)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@st.composite
def chats(draw) -> tuple[list[RoleSpan], list[str], list[str]]:
    """Roles + prompt texts (system, user with code, assistant header) and generated texts."""
    texts, roles = [], []
    for role in draw(st.sampled_from([[], ["user"], ["system", "user"]])):
        body = draw(tokens(draw(fragments)))
        start = len(texts)
        texts += ["<|im_start|>", role, "\n", *body, "<|im_end|>"]
        roles.append(RoleSpan(role, start, len(texts), start + 3, start + 3 + len(body)))
    if draw(st.booleans()):
        head = len(texts)
        texts += ["<|im_start|>", "assistant\n", *draw(tokens(draw(fragments)))]
        roles.append(RoleSpan("assistant", head, len(texts), head + 2, None))
    return roles, texts, draw(tokens(draw(fragments)))


def check_invariants(seg: Segmenter) -> None:
    n = seg.n_tokens
    spans = seg.spans()
    assert len(seg.labels()) == n and seg.protected_mask().shape == (n,)
    assert all(0 <= s.start <= s.end <= n for s in spans)
    assert all(s.end > s.start for s in spans if s.kind != "think")
    assert [(s.start, -s.end) for s in spans] == sorted((s.start, -s.end) for s in spans)
    blocks = seg.think_blocks()
    assert [b.index for b in blocks] == list(range(len(blocks)))
    assert all(b.closed for b in blocks[:-1])
    for s in spans:
        if s.parent is not None:
            assert blocks[s.parent].start <= s.start and s.end <= blocks[s.parent].end
        if s.kind == "signature":
            assert s.protected and seg.protected_mask()[s.start : s.end].all()


@settings(deadline=None)
@given(chats(), st.data(), st.booleans())
def test_incremental_equals_batch(chat_case, data, finish):
    roles, prompt, generated = chat_case
    batch = Segmenter(roles, prompt + generated, min_step_tokens=3)
    streamed = Segmenter(roles, prompt, min_step_tokens=3)
    check_invariants(streamed)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(generated)), max_size=12)))
    for a, b in zip([0, *cuts], [*cuts, len(generated)]):
        streamed.feed(generated[a:b])
        check_invariants(streamed)
    if finish:
        batch.finish()
        streamed.finish()
    assert snapshot(streamed) == snapshot(batch)


def reference_blocks(text: str) -> list[tuple[int, int | None]]:
    """Think blocks by plain string search (tags win over everything, no nesting)."""
    blocks, pos = [], 0
    while (start := text.find("<think>", pos)) >= 0:
        close = text.find("</think>", start + 7)
        blocks.append((start, None if close < 0 else close + 8))
        if close < 0:
            break
        pos = close + 8
    return blocks


@settings(deadline=None)
@given(fragments.flatmap(tokens))
def test_think_blocks_match_a_plain_string_search(texts):
    seg = Segmenter([], [])
    for piece in texts:
        seg.feed([piece])
    check_invariants(seg)
    reference = reference_blocks("".join(texts))
    blocks = seg.think_blocks()
    assert [b.closed for b in blocks] == [end is not None for _, end in reference]
    starts = [0, *itertools.accumulate(map(len, texts))]
    anchors = [anchor(t, s) for t, s in zip(texts, starts)]
    for block, (start, end) in zip(blocks, reference):
        assert block.start == sum(a < start for a in anchors)
        assert block.end == (len(texts) if end is None else sum(a < end for a in anchors))


# ---- multi-turn transcripts -------------------------------------------------------------------
def transcript_segmenter(**kwargs):
    """A segmenter built the way a replay builds it (prompt + ahead roles), fed the replayed
    tokens one by one as the engine decodes them; returns it and all token texts."""
    from tiny_models import tiny_model

    from thought_trace import conversation_and_trace

    loaded = tiny_model("llama")
    prompt, ids = conversation_and_trace(loaded)
    seg = Segmenter(prompt.roles, prompt.texts, **kwargs)
    texts = list(prompt.texts)
    everything = prompt.ids + ids
    for i in range(len(prompt.ids), len(everything)):
        piece = token_texts(loaded.tokenizer, everything[i : i + 1], prefix_ids=everything[max(0, i - 8) : i])
        texts += piece
        seg.feed(piece)
    seg.finish()
    return seg, texts, prompt.roles


def test_transcript_turns_tool_spans_and_blocks_numbered_across_turns():
    seg, texts, roles = transcript_segmenter(min_step_tokens=2)
    assert seg.n_tokens == len(texts) == roles[-1].end
    turns = [s for s in seg.spans() if s.kind in ("system", "user", "tool", "assistant")]
    assert [(s.kind, s.turn) for s in turns] == [(r.role, k) for k, r in enumerate(roles)]
    assert [(s.start, s.end) for s in turns] == [(r.start, r.end) for r in roles]
    assert [s.index for s in turns if s.kind == "tool"] == [0, 1, 2]
    tools = [s for s in turns if s.kind == "tool"]
    assert "1 failed, 1 passed" in text_of(texts, tools[0]) and not any(s.protected for s in tools)
    labels = seg.labels()
    for role in roles:
        if role.role == "tool":
            assert set(labels[role.body_start : role.body_end]) == {"tool"}
            assert set(labels[role.start : role.body_start]) == {"template"}
    blocks = seg.think_blocks()
    assert [(b.index, b.turn, b.closed) for b in blocks] == [(0, 2, True), (1, 4, True), (2, 7, True)]
    steps = of_kind(seg, "step")
    assert {s.parent for s in steps} == {0, 1, 2} and all(s.turn == blocks[s.parent].turn for s in steps)
    codes = of_kind(seg, "code")
    assert [(c.index, c.turn) for c in codes] == [(0, 2), (1, 4), (2, 7)]
    answers = of_kind(seg, "answer")
    assert [a.turn for a in answers] == [2, 4, 7, 9] and all(a.closed for a in answers)
    assert text_of(texts, answers[-1]) == "All tests pass now."
    # a block's code is the draft in its own turn, never a later turn's
    assert [seg.code_after(b) for b in blocks][1].startswith("def area(r: float) -> float\n")
    assert "circumference" in seg.code_after(blocks[2]) and "circumference" not in seg.code_after(blocks[0])


@pytest.mark.parametrize("protect_question", [True, False])
def test_every_user_turn_and_its_signatures_protected_tool_output_never(protect_question):
    seg, texts, roles = transcript_segmenter(protect_question=protect_question)
    mask = seg.protected_mask()
    signatures = of_kind(seg, "signature")
    assert [text_of(texts, s) for s in signatures] == [
        "def area(r: float) -> float:",
        "def circumference(r: float) -> float:",
    ]
    assert [s.turn for s in signatures] == [1, 6] and all(mask[s.start : s.end].all() for s in signatures)
    for turn, role in enumerate(roles):
        span = mask[role.start : role.end]
        if role.role == "user":
            signature_tokens = sum(s.end - s.start for s in signatures if s.turn == turn)
            assert span.all() if protect_question else span.sum() == signature_tokens
        elif role.role == "system":
            assert span.all()
        else:
            assert not span.any()


def test_transcript_streamed_equals_batch():
    seg, texts, roles = transcript_segmenter(min_step_tokens=3)
    batch = Segmenter([replace(r, ahead=False) for r in roles], texts, min_step_tokens=3)
    batch.finish()
    assert snapshot(batch) == snapshot(seg)


def test_a_turn_boundary_ends_an_open_block_and_fence():
    texts = ["<think>", "a", "```", "x", "<end>", "\n", "<u>", "q", "<end>", "<a>", "b", "</think>"]
    roles = [RoleSpan("assistant", 0, 6, 0, 4), RoleSpan("user", 6, 9, 7, 8), RoleSpan("assistant", 9, 12, 10, 12)]
    seg = Segmenter(roles, texts, min_step_tokens=0)
    (block,) = seg.think_blocks()  # the stray </think> of turn 3 closes nothing from turn 1
    assert (block.start, block.end, block.closed, block.turn) == (0, 4, False, 0)
    (code,) = of_kind(seg, "code")
    assert (code.end, code.closed) == (4, False)
    assert seg.labels()[9:] == ["template", "answer", "answer"] and seg.code_after(block) is None


def test_ahead_roles_may_lie_beyond_the_tokens_given():
    roles = [RoleSpan("user", 0, 3, 1, 2), RoleSpan("assistant", 3, 9, 4, 8, ahead=True)]
    seg = Segmenter(roles, ["<u>", "q", "<e>"])
    assert seg.labels() == ["template", "user", "template"] and seg.think_blocks() == []
    seg.feed(["<a>", "<think>", "x", "</think>"])
    assert seg.labels()[3:] == ["template", "tag", "think", "tag"]
    assert seg.think_blocks()[0].turn == 1
    seg.feed(["y", "<e>", "extra"])  # after the last turn: the assistant's, as for a chat
    assert seg.labels()[-3:] == ["answer", "template", "answer"]
    with pytest.raises(ValueError, match="beyond"):
        Segmenter([replace(roles[1], ahead=False)], ["a"] * 3)
