"""think_drop: drop whole finished ``<think>`` blocks, oldest first, once their code parses.

Dynamic token-dropping for local reflection loops (the article "Dynamic Token-Dropping:
Optimizing Edge KV-Cache Slices for Local Reflection Loops"): an agent that drafts, tests and
rewrites code leaves a ``<think>`` block behind every loop.  Once a loop is over and the code
it produced is sound, its reasoning is the cheapest thing to forget.  The rules:

- only *completed* think blocks (``</think>`` seen) are ever evicted, each as a whole, tags
  included, and in the order they were written;
- a block is evictable only once the code that follows it *in its own assistant turn* parses
  (:func:`code_parses`: Python's ``ast.parse``, never compiled or run).  No complete code after
  it yet → ``"pending"``, code that does not parse → ``"syntax error"``: either way the
  reasoning stays, it may be needed to debug;
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
import functools
import warnings
from typing import TYPE_CHECKING, Any

import torch

from .base import CacheView, Policy, keep_top
from .registry import register

if TYPE_CHECKING:
    from ..text.segments import Segmenter


@functools.lru_cache(maxsize=256)
def code_parses(source: str) -> bool:
    """Whether ``source`` is syntactically valid Python (``ast.parse`` only; nothing is executed)."""
    try:
        with warnings.catch_warnings():
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


def block_states(segments: Segmenter) -> list[dict[str, Any]]:
    """Every think block of ``segments`` in order: ``index``, ``turn``, token range
    ``start``/``end``, ``closed`` and ``code``, the :func:`code_state` of the code after it."""
    blocks = []
    for span in segments.think_blocks():
        code = segments.code_after(span) if span.closed else None
        blocks.append(
            {
                "index": span.index,
                "turn": span.turn,
                "start": span.start,
                "end": span.end,
                "closed": span.closed,
                "code": code_state(code),
            }
        )
    return blocks


def _verified(block: dict[str, Any]) -> bool:
    """A block this rule may drop: closed, and the code after it parses."""
    return block["closed"] and block["code"] == "parsed"


@register
class ThinkDrop(Policy):
    """Keep everything except whole completed think blocks whose following code parses, which are
    dropped oldest first while the cache is over budget (rules in the module docstring)."""

    name = "think_drop"
    score_scale = None  # a 0/1 flag (evictable block or not): nothing graded
    summary = (
        "When memory is short, forget whole finished <think> blocks, oldest first — but only once "
        "the code written after them parses. Nothing else is ever dropped."
    )
    source = "Dynamic Token-Dropping for local reflection loops (article: 'Optimizing Edge KV-Cache Slices')"
    hard_budget = False

    def score(self, view: CacheView) -> torch.Tensor:
        """``(L, H_kv, T)``: 0 for slots of a block this rule may drop, 1 for slots it must keep."""
        evictable = torch.zeros(len(view.protected), dtype=torch.bool)
        for block in self._blocks(view):
            if _verified(block):
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
            if not _verified(block):
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
        left_to_drop = [b for b in blocks if _verified(b) and not b["evicted"]]
        info: dict[str, Any] = {"blocks": blocks, "over_budget": excess > 0 and not left_to_drop}
        if info["over_budget"]:
            info["excess_tokens"] = excess
        if view.segments is None:
            info["note"] = "a plain token prompt has no think blocks: nothing can be dropped"
        return info

    @staticmethod
    def _blocks(view: CacheView) -> list[dict[str, Any]]:
        return [] if view.segments is None else block_states(view.segments)

    @staticmethod
    def _present(view: CacheView) -> torch.Tensor:
        """``(N,)`` bool: positions held by at least one slot."""
        present = torch.zeros(len(view.protected), dtype=torch.bool)
        present[view.positions.flatten()] = True
        return present
