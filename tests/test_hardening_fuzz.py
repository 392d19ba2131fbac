"""Fuzz what the existing suites do not: arbitrary text (any Unicode, control characters,
markers, code fences) through the segmenter and think_drop's parse check, and hostile token
text streamed as patches through a :class:`TokenChannel`.

test_segments fuzzes the segmenter on well-formed chats and test_viz_tokens fuzzes one full
render; the invariants and the simulated browser come from those modules.
"""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_segments import check_invariants
from test_viz_tokens import SimulatedDom, chat_segmenter, parse

from thinkviz.policies.think_drop import code_parses
from thinkviz.text.segments import Segmenter
from thinkviz.ui.stream import TokenChannel
from thinkviz.viz.tokens import MODES, TokenData, render_tokens

MARKERS = [
    "<think>",
    "</think>",
    "<think",
    "think>",
    "```python\n",
    "```",
    "\n\n",
    "\n",
    "def f(x):\n",
    "    return x\n",
    "Step 1:",
    "<|im_start|>",
    "\r\n",
    "\x00",
    "\u202e",
    "&amp;",
    "<script>",
]
pieces = st.one_of(st.sampled_from(MARKERS), st.text(max_size=8))


@settings(deadline=None)
@given(st.lists(st.lists(pieces, max_size=4), max_size=12), st.booleans())
def test_segmenter_survives_any_text_fed_in_any_pieces(feeds, finish):
    seg = Segmenter([], [], min_step_tokens=2)
    for batch in feeds:
        seg.feed(batch)
        check_invariants(seg)
    if finish:
        seg.finish()
        check_invariants(seg)
    assert seg.n_tokens == sum(map(len, feeds))
    for block in seg.think_blocks():
        code = seg.code_after(block)
        assert code is None or (isinstance(code, str) and isinstance(code_parses(code), bool))


@settings(deadline=None)
@given(
    st.text(max_size=200)
    | st.lists(st.sampled_from(["(", "[", "-", "lambda:", "\\", "\x00", "'''"]), max_size=400).map("".join)
)
def test_the_parse_check_answers_for_any_text(source):
    assert isinstance(code_parses(source), bool)


hostile_text = st.text(alphabet=st.sampled_from(list("<>&\"'/= \nab")) | st.characters(), max_size=10)


@settings(deadline=None)
@given(
    stream=st.lists(st.tuples(hostile_text, st.floats(0, 1), st.booleans()), min_size=1, max_size=20),
    mode=st.sampled_from(MODES),
)
def test_streamed_patches_of_hostile_text_stay_text_and_rebuild_the_view(stream, mode):
    prompt, seg = chat_segmenter([])
    texts, keep = list(prompt), [1.0] * len(prompt)
    channel, dom = TokenChannel("t", mode=mode, title_refresh=0.0), SimulatedDom()
    for i, (piece, score, evict) in enumerate(stream):
        seg.feed([piece])
        texts.append(piece)
        keep.append(1.0)
        if evict:
            keep[len(prompt) + i // 2] = 0.0
        scores = np.full(len(texts), score, dtype=np.float32)
        data = TokenData(
            texts=list(texts), scores=scores, keep_fraction=np.array(keep), labels=seg.labels(), spans=seg.spans()
        )
        message = json.loads(json.dumps(channel.message(data)))
        patch = message["patch"]
        for fragment in (patch["reset"], patch["append"]):
            if fragment:
                assert parse(fragment).foreign == []
        dom.apply(patch)
        full = render_tokens(data, mode)
        assert dom.same_as(full)
        assert [t["text"] for t in dom.tokens] == texts
