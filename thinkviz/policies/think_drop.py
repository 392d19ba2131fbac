"""think_drop: drop whole finished ``<think>`` blocks, oldest first, once their code is verified.

Dynamic token-dropping for local reflection loops (the article "Dynamic Token-Dropping:
Optimizing Edge KV-Cache Slices for Local Reflection Loops"): an agent that drafts, tests and
rewrites code leaves a ``<think>`` block behind every loop.  Once a loop is over and the code
it produced is sound, its reasoning is the cheapest thing to forget.  The rules:

- only *completed* think blocks (``</think>`` seen) are ever evicted, each as a whole, tags
  included, and in the order they were written;
- a block is evictable only once its code is verified, as the ``verify`` knob says:

  - ``parse`` (the default): the code that follows it *in its own assistant turn* parses
    (:func:`code_parses`: Python's ``ast.parse``, never compiled or run).  No complete code
    after it yet → ``"pending"``, code that does not parse → ``"syntax error"``: either way the
    reasoning stays, it may be needed to debug;
  - ``tests``: a later tool turn of the same reflection loop (the turns up to the next user
    message) reports a passing test run (:func:`tool_verdict`: pytest's, unittest's or a plain
    ``N passed`` / ``OK`` summary with no failures or errors).  A failing or erroring run keeps
    the block, the next draft may need it to debug; once a run passes, every earlier block of
    that loop may go.  A live generation has no tool turns: nothing is ever verified;
- protected tokens (system prompt, question, file signatures, per the protection toggles) are
  never evicted, even inside a block; nothing outside think blocks is ever evicted;
- blocks are dropped only while the cache exceeds the budget, as few as bring it within it.

In a multi-turn transcript (agent loops with tool output and further user requests) the blocks
of all turns form one queue, oldest first; tool output and user turns are never dropped.

When dropping every evictable block still leaves the cache over budget, nothing else is
evicted: the cache stays over budget and :meth:`ThinkDrop.step_info` says so
(``"over_budget": True`` with the excess), so the memory chart shows a budget this rule cannot
hold.  The decision is per position: every layer and kv-head keeps the same tokens.
"""

from __future__ import annotations

import ast
import bisect
import functools
import re
import warnings
from typing import TYPE_CHECKING, Any

import torch

from ..parser_lock import PARSER_LOCK
from .base import CacheView, Param, Policy, keep_top
from .registry import register

if TYPE_CHECKING:
    from ..text.segments import Segmenter


@functools.lru_cache(maxsize=256)
def code_parses(source: str) -> bool:
    """Whether ``source`` is syntactically valid Python (``ast.parse`` only; nothing is executed)."""
    try:
        with PARSER_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. invalid escapes in model output
            ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def code_state(code: str | None) -> str:
    """``"pending"`` (no complete code yet), ``"parsed"`` or ``"syntax error"``."""
    if code is None:
        return "pending"
    return "parsed" if code_parses(code) else "syntax error"


_COUNTS = re.compile(r"\b(\d+) (passed|failed|errors?)\b")  # pytest's summary, or a plain "N passed"
_UNITTEST = re.compile(r"^(OK|FAILED)(?: \(([^)\n]*)\))?[^\S\n]*$", re.MULTILINE)  # "OK", "FAILED (errors=1)"
_UNITTEST_COUNTS = re.compile(r"(failures|errors)=(\d+)")


@functools.lru_cache(maxsize=256)
def tool_verdict(output: str) -> str:
    """What a tool turn's ``output`` says of a test run: ``"passed"``, ``"failed"``, ``"error"`` or ``"none"``.

    Read from pytest's summary (``1 failed, 2 passed in 0.41s``, ``1 error in 0.12s``), unittest's
    (``OK``, ``FAILED (failures=1, errors=2)``) or a plain ``N passed`` / ``OK`` line: any failure →
    ``failed``; else any error (a collection error, a traceback with no summary) → ``error``; else
    a pass → ``passed``; no summary at all → ``none``."""
    counts = {"passed": 0, "failed": 0, "error": 0}
    for number, word in _COUNTS.findall(output):
        counts["error" if word.startswith("error") else word] += int(number)
    for verdict, detail in _UNITTEST.findall(output):
        found = {kind: int(n) for kind, n in _UNITTEST_COUNTS.findall(detail)}
        counts["failed"] += found.get("failures", 0) + (verdict == "FAILED" and not found)
        counts["error"] += found.get("errors", 0)
        counts["passed"] += verdict == "OK"
    if counts["failed"]:
        return "failed"
    if counts["error"] or (not counts["passed"] and "Traceback (most recent call last)" in output):
        return "error"
    return "passed" if counts["passed"] else "none"


def block_states(segments: Segmenter) -> list[dict[str, Any]]:
    """Every think block of ``segments`` in order: ``index``, ``turn``, token range
    ``start``/``end``, ``closed``, ``code``, the :func:`code_state` of the code after it, and
    ``tests``, the :func:`tool_verdict` of the first complete tool turn after it in its reflection
    loop (``"none"`` when there is none yet), and ``tests_passed``, whether a later tool turn of that
    loop reports a passing run."""
    users = [span.turn for span, _ in segments.messages("user")]
    runs = [
        (span.turn, bisect.bisect_right(users, span.turn), tool_verdict(text))
        for span, text in segments.messages("tool")
        if span.closed
    ]
    blocks = []
    for span in segments.think_blocks():
        code = segments.code_after(span) if span.closed else None
        loop = bisect.bisect_right(users, span.turn)  # user turns up to this block's: its reflection loop
        later = [outcome for turn, in_loop, outcome in runs if in_loop == loop and turn > span.turn]
        blocks.append(
            {
                "index": span.index,
                "turn": span.turn,
                "start": span.start,
                "end": span.end,
                "closed": span.closed,
                "code": code_state(code),
                "tests": later[0] if later else "none",
                "tests_passed": "passed" in later,
            }
        )
    return blocks


@register
class ThinkDrop(Policy):
    """Keep everything except whole completed think blocks whose code is verified (``verify``:
    it parses, or a later tool turn's tests pass), which are dropped oldest first while the cache
    is over budget (rules in the module docstring).

    Where ThinkViz departs from the article: its loop is draft → *run tests* → rewrite, and it
    drops a loop's thinking "once the code output is verified".  ThinkViz runs nothing:
    ``verify=tests`` reads the verdict of the tests the transcript's own tool turns ran, and
    ``verify=parse`` (the default, and the only gate a live generation, which has no tool turns,
    can pass) stands in for them with a syntax check, so a block whose code parses but fails
    its tests is dropped at once."""

    name = "think_drop"
    score_scale = None  # a 0/1 flag (evictable block or not): nothing graded
    summary = (
        "When memory is short, forget whole finished <think> blocks, oldest first — but only once "
        "the code written after them parses (or, with verify=tests, once its tests pass). Nothing "
        "else is ever dropped."
    )
    source = "Dynamic Token-Dropping for local reflection loops (article: 'Optimizing Edge KV-Cache Slices')"
    params = (
        Param(
            "verify",
            "parse",
            choices=("parse", "tests"),
            help="when a block may go: parse, once the code after it parses; tests, once a later tool "
            "turn of its loop reports a passing test run (the article's gate)",
            before="parse",
        ),
    )
    hard_budget = False

    def score(self, view: CacheView) -> torch.Tensor:
        """``(L, H_kv, T)``: 0 for slots of a block this rule may drop, 1 for slots it must keep."""
        evictable = torch.zeros(len(view.protected), dtype=torch.bool)
        for block in self._blocks(view):
            if block["verified"]:
                evictable[block["start"] : block["end"]] = True
        return view.by_position(~(evictable & ~view.protected)).float()

    def select(self, view: CacheView) -> torch.Tensor:
        total = view.positions.shape[-1]
        excess = total - self.target(view.seen)
        drop = torch.zeros(len(view.protected), dtype=torch.bool)
        present = self._present(view)
        for block in self._blocks(view):
            if excess <= 0:
                break
            if not block["verified"]:
                continue
            span = torch.zeros_like(drop)
            span[block["start"] : block["end"]] = True
            span &= present & ~view.protected
            drop |= span
            excess -= int(span.sum())
        keep = ~view.by_position(drop)  # (L, H_kv, T)
        return keep_top(torch.zeros(keep.shape), keep, int(keep.sum(-1).max()))

    def step_info(self, view: CacheView) -> dict[str, Any]:
        blocks = self._blocks(view)
        present = self._present(view)
        for block in blocks:
            unprotected = ~view.protected[block["start"] : block["end"]]
            held = present[block["start"] : block["end"]] & unprotected
            block["evicted"] = bool(unprotected.any()) and not bool(held.any())
        excess = view.positions.shape[-1] - self.target(view.seen)
        left_to_drop = [b for b in blocks if b["verified"] and not b["evicted"]]
        info: dict[str, Any] = {"blocks": blocks, "over_budget": excess > 0 and not left_to_drop}
        if info["over_budget"]:
            info["excess_tokens"] = excess
        if view.segments is None:
            info["note"] = "a plain token prompt has no think blocks: nothing can be dropped"
        return info

    def _blocks(self, view: CacheView) -> list[dict[str, Any]]:
        """:func:`block_states`, each with ``verified``: closed and past this rule's ``verify`` gate."""
        blocks = [] if view.segments is None else block_states(view.segments)
        for block in blocks:
            gate = block["code"] == "parsed" if self.verify == "parse" else block["tests_passed"]
            block["verified"] = block["closed"] and gate
        return blocks

    @staticmethod
    def _present(view: CacheView) -> torch.Tensor:
        """``(N,)`` bool: positions held by at least one slot."""
        present = torch.zeros(len(view.protected), dtype=torch.bool)
        present[view.positions.flatten()] = True
        return present
