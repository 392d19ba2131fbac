"""think_drop (dynamic token-dropping for reflection loops): whole completed think blocks go,
oldest first, only after their code parses."""

from __future__ import annotations

import numpy as np
import pytest

from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.policies import make_policy
from thinkviz.policies.think_drop import code_parses, code_state

from thought_trace import chat_and_trace
from tiny_models import tiny_model


def _replay(loaded, budget, **params):
    prompt, trace = chat_and_trace(loaded.tokenizer)
    run = Run(loaded, make_policy("think_drop", budget=budget, interval=1, **params), prompt, DecodeSettings())
    return run, list(run.replay(trace))


def _block_states(event):
    return [(b["index"], b["closed"], b["code"], b["evicted"]) for b in event.info["blocks"]]


def _first_event(events, predicate):
    return next(e for e in events if predicate(e))


@pytest.fixture(scope="module")
def probe():
    """A replay whose budget is never reached: the block states alone, shared by two tests."""
    return _replay(tiny_model("llama"), budget=4096)


def test_verification_states_follow_the_code_after_each_block(probe):
    run, events = probe
    assert not any(e.evicted for e in events)
    last = events[-1]
    assert _block_states(last) == [
        (0, True, "parsed", False),
        (1, True, "syntax error", False),  # "def area(r: float) -> float" lacks its colon
        (2, True, "parsed", False),
    ]
    # a block is pending until the code after it is complete, then verified once
    for index, final in [(0, "parsed"), (1, "syntax error")]:
        history = [b["code"] for e in events for b in e.info["blocks"] if b["index"] == index]
        changes = [s for i, s in enumerate(history) if i == 0 or s != history[i - 1]]
        assert changes == ["pending", final]
    # the block boundaries are the segmenter's think blocks
    spans = run.segmenter.think_blocks()
    assert [(b["start"], b["end"]) for b in last.info["blocks"]] == [(s.start, s.end) for s in spans]


def test_drops_the_oldest_evictable_block_first(tiny_llama, probe):
    # the first moment both block 0 and block 2 are evictable (block 2's code just parsed)
    ready = _first_event(probe[1], lambda e: len(e.info["blocks"]) == 3 and e.info["blocks"][2]["code"] == "parsed")
    budget = ready.positions[-1] + 1  # the next token puts the cache one over budget
    run, events = _replay(tiny_llama, budget=budget)
    first = _first_event(events, lambda e: e.evicted)
    block0, block1, block2 = first.info["blocks"]
    assert first.evicted == list(range(block0["start"], block0["end"]))  # exactly block 0, whole
    assert block0["evicted"] and not block1["evicted"] and not block2["evicted"]
    assert first.kv_tokens <= budget and not first.info["over_budget"]


def test_keeps_a_block_whose_code_does_not_parse_and_reports_over_budget(tiny_llama):
    run, events = _replay(tiny_llama, budget=160)
    last = events[-1]
    assert _block_states(last) == [
        (0, True, "parsed", True),
        (1, True, "syntax error", False),
        (2, True, "parsed", True),
    ]
    gone = np.flatnonzero(last.keep_fraction == 0)
    blocks = last.info["blocks"]
    expected = [p for b in (blocks[0], blocks[2]) for p in range(b["start"], b["end"])]
    assert gone.tolist() == expected  # nothing outside the two verified blocks ever goes
    # what is left exceeds the budget and only the unparsable block could go: reported
    assert last.kv_tokens > 160
    assert last.info["over_budget"] and last.info["excess_tokens"] == last.kv_tokens - 160
    # over budget is reported only when nothing evictable is left, never while a block could go
    for event in events:
        if event.info["over_budget"]:
            evictable = [b for b in event.info["blocks"] if b["code"] == "parsed" and not b["evicted"]]
            assert not evictable


@pytest.mark.parametrize("protect", [True, False])
def test_never_evicts_protected_spans_or_anything_outside_blocks(tiny_llama, protect):
    run, events = _replay(tiny_llama, budget=100, protect_system=protect, protect_question=protect)
    protected = run.segmenter.protected_mask()
    assert protected[: len(run.record.prompt_ids) - 8].all() == protect
    inside_blocks = np.zeros(len(events[-1].keep_fraction), dtype=bool)
    for block in run.segmenter.think_blocks():
        inside_blocks[block.start : block.end] = True
    for event in events:
        gone = event.keep_fraction == 0
        assert not gone[protected[: len(gone)]].any()
        assert not gone[~inside_blocks[: len(gone)]].any()
    # every layer and kv-head keeps the same tokens
    assert set(np.unique(events[-1].keep_fraction)) <= {0.0, 1.0}


def test_plain_token_prompts_have_no_blocks_and_say_so(tiny_llama):
    run = Run(
        tiny_llama,
        make_policy("think_drop", budget=16),
        list(range(100, 130)),
        DecodeSettings(max_new_tokens=3, stop_at_eos=False),
    )
    events = list(run.generate())
    assert not any(e.evicted for e in events)
    assert events[-1].info["blocks"] == [] and events[-1].info["over_budget"]
    assert "no think blocks" in events[-1].info["note"]


def test_code_is_parsed_never_executed(tmp_path):
    marker = tmp_path / "ran"
    assert code_parses(f"open({str(marker)!r}, 'w').write('x')\nraise SystemExit(3)\n")
    assert not marker.exists()
    assert code_state(None) == "pending"
    assert code_state("def f(:\n    pass") == "syntax error"
    assert not code_parses("x = 1\x00")  # ValueError or SyntaxError, depending on the Python
    assert not code_parses("(" * 200_000)  # nesting too deep: an error, not a crash
    assert code_parses("print('\\d')")  # an invalid escape warns, it is still valid syntax


# ---- a multi-turn transcript: tool output and a second user request between the loops -------
def _replay_transcript(loaded, budget, interval=1, **params):
    from thought_trace import conversation_and_trace

    prompt, trace = conversation_and_trace(loaded)
    run = Run(loaded, make_policy("think_drop", budget=budget, interval=interval, **params), prompt, DecodeSettings())
    return run, list(run.replay(trace))


@pytest.fixture(scope="module")
def transcript_probe():
    return _replay_transcript(tiny_model("llama"), budget=4096)


def test_transcript_blocks_are_settled_by_the_code_of_their_own_turn(transcript_probe):
    run, events = transcript_probe
    blocks = events[-1].info["blocks"]
    states = [(b["index"], b["turn"], b["code"]) for b in blocks]
    assert states == [(0, 2, "parsed"), (1, 4, "syntax error"), (2, 7, "parsed")]
    # block 1 is settled by its own draft (no colon), not by block 2's fixed one in a later turn
    settled = _first_event(events, lambda e: len(e.info["blocks"]) > 1 and e.info["blocks"][1]["code"] != "pending")
    assert settled.info["blocks"][1]["code"] == "syntax error"
    assert settled.positions[-1] < blocks[2]["start"]  # settled before block 2 was even written


@pytest.mark.slow  # replays a 4,400-token agent transcript: 5 s
def test_transcript_drops_completed_blocks_oldest_first_keeps_the_unparsable_one(tiny_llama, transcript_probe):
    def both_verified(e):
        return len(e.info["blocks"]) == 3 and e.info["blocks"][2]["code"] == "parsed"

    ready = _first_event(transcript_probe[1], both_verified)
    budget = ready.positions[-1] + 1  # one over budget at the next token: both verified blocks are there
    run, events = _replay_transcript(tiny_llama, budget=budget)
    first = _first_event(events, lambda e: e.evicted)
    block0, block1, block2 = first.info["blocks"]
    assert first.evicted == list(range(block0["start"], block0["end"]))  # the oldest, whole, alone
    assert block0["evicted"] and not block1["evicted"] and not block2["evicted"]
    tight, tight_events = _replay_transcript(tiny_llama, budget=64)
    last = tight_events[-1]
    assert [(b["index"], b["evicted"]) for b in last.info["blocks"]] == [(0, True), (1, False), (2, True)]
    assert last.info["over_budget"]  # only whole verified blocks may go; the rest stays


@pytest.mark.parametrize("protect", [True, False])
def test_transcript_never_evicts_a_user_turn_or_tool_output(tiny_llama, protect):
    run, events = _replay_transcript(
        tiny_llama, budget=64, interval=4, protect_system=protect, protect_question=protect
    )
    labels = run.segmenter.labels()
    keep = events[-1].keep_fraction
    gone = keep == 0
    assert gone.any()
    turns = [s for s in run.segmenter.spans() if s.kind in ("user", "tool")]
    assert [s.kind for s in turns] == ["user", "tool", "tool", "user", "tool"]
    for span in turns:
        assert not gone[span.start : span.end].any(), (span.kind, span.turn)
    assert {labels[p] for p in np.flatnonzero(gone)} <= {"think", "tag", "code"}
