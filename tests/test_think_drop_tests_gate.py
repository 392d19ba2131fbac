"""think_drop's ``verify=tests`` gate (the article's loop: draft → run tests → rewrite): a think
block may go only once a later tool turn of its reflection loop reports a passing test run; a
failing or erroring run keeps it.  ``inspect --json`` reports each block's first test verdict."""

from __future__ import annotations

import json

import pytest

from thinkviz.cli import main
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.measure.replay import prepare_transcript
from thinkviz.policies import make_policy
from thinkviz.policies.think_drop import tool_verdict
from thinkviz.text.transcript import Message
from thinkviz.viz.tokens import token_view

from thought_trace import conversation_and_trace

FAILING = (
    "..F\n=================================== FAILURES ===================================\n"
    "tests/test_geometry.py:9: in test_area\n    assert area(1) == pytest.approx(math.pi)\n"
    "E   assert 3.14 == 3.141592653589793 ± 3.1e-06\n"
    "FAILED tests/test_geometry.py::test_area - assert 3.14 == 3.141592653589793 ± 3.1e-06\n"
    "1 failed, 2 passed in 0.03s"
)
# One reflection loop: a draft whose tests fail, a rewrite whose tests pass, then a last block.
LOOP = (
    ("user", "Make area() return the area of a circle. Tests are in tests/test_geometry.py."),
    (
        "assistant",
        "<think>\nThe function returns the circumference, not the area.\n\n"
        "The area is pi times the radius squared; a literal for pi will do.\n</think>\n\n"
        "```python\ndef area(r):\n    return 3.14 * r * r\n```\n\n$ pytest -q tests/test_geometry.py",
    ),
    ("tool", FAILING),
    (
        "assistant",
        "<think>\nThe test compares with math.pi to six digits: the literal is too coarse.\n\n"
        "Import math and use math.pi.\n</think>\n\n"
        "```python\nimport math\n\n\ndef area(r):\n    return math.pi * r ** 2\n```\n\n$ pytest -q",
    ),
    ("tool", "...                                                                      [100%]\n3 passed in 0.02s"),
    ("assistant", "<think>\nAll three pass; summarise the change.\n</think>\n\nFixed: `area` now uses `math.pi`."),
)


@pytest.mark.parametrize(
    "output, verdict",
    [
        (FAILING, "failed"),
        ("...\n3 passed in 0.02s", "passed"),
        ("==== 11 passed, 2 skipped in 0.35s ====", "passed"),
        ("ERROR collecting tests/test_time.py\nE   SyntaxError: '(' was never closed\n1 error in 0.12s", "error"),
        ("1 failed, 1 error in 0.2s", "failed"),
        ("..\n" + "-" * 70 + "\nRan 2 tests in 0.001s\n\nOK", "passed"),
        ("Ran 3 tests in 0.002s\n\nOK (skipped=1)", "passed"),
        ("Ran 3 tests in 0.002s\n\nFAILED (failures=1)", "failed"),
        ("Ran 3 tests in 0.002s\n\nFAILED (errors=2)", "error"),
        ("5 passed", "passed"),
        ("OK", "passed"),
        ("Traceback (most recent call last):\n  File \"x.py\", line 1\nNameError: name 'y' is not defined", "error"),
        ("total 12\n-rw-r--r-- 1 dev dev 340 lru.py", "none"),
        ("3 passed, 0 failed", "passed"),
    ],
)
def test_a_tool_turn_s_test_verdict(output, verdict):
    assert tool_verdict(output) == verdict


def _replay(loaded, messages, verify, budget):
    prompt, ids = prepare_transcript(loaded, [Message(role, text) for role, text in messages])
    run = Run(loaded, make_policy("think_drop", budget=budget, interval=1, verify=verify), prompt, DecodeSettings())
    return run, list(run.replay(ids))


def _tool_ends(run):
    """The token positions where each tool turn's last token is in."""
    return [span.end - 1 for span, _ in run.segmenter.messages("tool")]


def test_verify_tests_drops_nothing_after_the_failure_and_the_loop_s_blocks_after_the_pass(tiny_llama):
    run, events = _replay(tiny_llama, LOOP, "tests", budget=64)  # over budget from the first block on
    failed_at, passed_at = _tool_ends(run)
    blocks = events[-1].info["blocks"]
    assert [b["tests"] for b in blocks] == ["failed", "passed", "none"]
    assert [b["verified"] for b in blocks] == [True, True, False]
    dropped = [p for e in events for p in e.evicted]
    assert dropped, "the test must exercise real evictions"
    first_drop = next(e for e in events if e.evicted)
    assert first_drop.positions[-1] >= passed_at > failed_at  # nothing goes until the passing run is in
    assert all(e.info["over_budget"] for e in events if failed_at <= e.positions[-1] < passed_at)
    gone = {p for b in blocks[:2] for p in range(b["start"], b["end"])}
    assert set(dropped) == gone - set(p for p in gone if run.segmenter.protected_mask()[p])  # both blocks, whole
    assert not blocks[2]["evicted"]
    assert token_view(run.record).verified == {0, 1}  # the segment view marks the two


def test_verify_parse_drops_the_failing_draft_s_block_at_once(tiny_llama):
    run, events = _replay(tiny_llama, LOOP, "parse", budget=64)
    failed_at, _ = _tool_ends(run)
    first_drop = next(e for e in events if e.evicted)
    assert first_drop.positions[-1] < failed_at  # its code parsed: gone before its tests failed
    assert events[-1].info["blocks"][0]["evicted"]


def test_a_pass_verifies_only_its_own_loop(tiny_llama):
    """The shared transcript: loop 1 fails then errors, the user speaks, loop 2 passes."""
    prompt, ids = conversation_and_trace(tiny_llama)
    run = Run(tiny_llama, make_policy("think_drop", budget=4096, verify="tests"), prompt, DecodeSettings())
    events = list(run.replay(ids))
    blocks = events[-1].info["blocks"]
    assert [b["tests"] for b in blocks] == ["failed", "error", "passed"]
    assert [b["verified"] for b in blocks] == [False, False, True]


def test_inspect_json_gives_each_block_its_first_test_verdict(tmp_path, capsys):
    path = tmp_path / "loop.txt"
    path.write_text("\n".join(f"{role.upper()}: {text}" for role, text in LOOP), encoding="utf-8")
    assert main(["inspect", str(path), "--json"]) == 0
    blocks = json.loads(capsys.readouterr().out)["think_blocks"]
    assert [b["tests"] for b in blocks] == ["failed", "passed", "none"]
    assert [b["tests_passed"] for b in blocks] == [True, True, False]
