"""Token → segment labels for a chat whose assistant reasons inside ``<think>`` blocks.

The prompt part comes from the chat's role spans: system and user message text,
template markers around them, and *signatures* (``def``/``class`` headers of code the
user supplied, always protected).  The assistant part is parsed incrementally as
tokens stream in:

- ``<think>…</think>`` blocks, numbered in order (reflection loops).  Blocks do not
  nest: an inner ``<think>`` is text; a ``</think>`` with no open block is text; a
  block that never closes stays open (``closed=False``).
- reasoning steps inside a block: split after blank lines (outside code fences);
  steps shorter than ``min_step_tokens`` are merged into the previous one (a short
  first step into the next).
- fenced code (```` ``` ````…```` ``` ````), in the answer or inside thinking.  Tags win over
  fences: a ``<think>`` (or, inside thinking, ``</think>``) ends an open fence unclosed.
- answer text: everything in the assistant turn outside think blocks.

Detection runs on the concatenated text, so tags split over tokens (``<th`` +
``ink>``) are found; character offsets map back to tokens with the anchor rule of
:mod:`thinkviz.chat`: a token belongs to the span containing its first
non-whitespace character (its first character when it is all whitespace).  A
token straddling a boundary therefore goes where its visible text starts:
``" </"`` belongs to the closing tag, ``"x<th"`` to the text before the tag.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .chat import RoleSpan, anchor, token_boundary

_OPEN, _CLOSE, _FENCE = "<think>", "</think>", "```"
_BREAK = r"\n[^\S\n]*\n\s*(?=\S)"  # a blank line; the next step starts at the next visible char
_IN_ANSWER = re.compile(f"{re.escape(_OPEN)}|{_FENCE}")  # also inside answer code
_IN_THINK = re.compile(f"{re.escape(_CLOSE)}|{_FENCE}|{_BREAK}")
_IN_THINK_CODE = re.compile(f"{re.escape(_CLOSE)}|{_FENCE}")
_HOLD = len(_CLOSE) - 1  # longest partial match a scan may have to wait on

_SIGNATURE = re.compile(
    r"^[^\S\n]*((?:async[^\S\n]+)?(?:def[^\S\n]+\w+[^\S\n]*\(|class[^\S\n]+\w+[^\S\n]*[(:]))", re.MULTILINE
)
_KINDS = ["system", "user", "signature", "think", "tag", "step", "answer", "code"]
_ORDER = {kind: i for i, kind in enumerate(_KINDS)}  # ties in spans(): the outer kind first


@dataclass(frozen=True)
class Span:
    """Tokens ``[start, end)`` (absolute positions) of one segment.

    ``index`` is the ordinal among the spans of its kind (for steps: within their
    think block).  ``closed``: for think/code, the closing tag/fence has been seen;
    for the other kinds, the span will not grow any more.  ``parent``: for
    step/code/tag, the index of the think block containing it, else ``None``.
    """

    kind: str
    index: int
    start: int
    end: int
    closed: bool
    protected: bool
    parent: int | None = None

    @property
    def inside_think(self) -> bool:
        """True for a step, tag or code span that lies inside a think block."""
        return self.parent is not None


class _Text:
    """Token texts laid end to end: character starts, anchors, slicing, char → token."""

    def __init__(self, texts: Iterable[str] = ()) -> None:
        self.pieces: list[str] = []
        self.starts: list[int] = []
        self.anchors: list[int] = []
        self.n_chars = 0
        self.append(texts)

    def append(self, texts: Iterable[str]) -> None:
        for piece in texts:
            self.pieces.append(piece)
            self.starts.append(self.n_chars)
            self.anchors.append(anchor(piece, self.n_chars))
            self.n_chars += len(piece)

    def token(self, char: int) -> int:
        """Number of tokens anchored before ``char``: the token index a span at ``char`` starts at."""
        return token_boundary(self.anchors, char)

    def slice(self, lo: int, hi: int) -> str:
        """Characters ``[lo, hi)``, joined from the few pieces that hold them."""
        first = max(0, bisect.bisect_right(self.starts, lo) - 1)
        last = bisect.bisect_left(self.starts, hi)
        offset = self.starts[first] if self.starts else 0
        return "".join(self.pieces[first:last])[lo - offset : hi - offset]


@dataclass
class _Block:
    """A think block in assistant-text characters: ``<think>`` at ``start``, body from ``body``."""

    start: int
    body: int
    close: int | None = None  # where ``</think>`` starts
    end: int | None = None  # just after ``</think>``
    breaks: list[int] = field(default_factory=list)  # where steps after the first start


@dataclass
class _Fence:
    """A fenced code block in assistant-text characters; ``end`` is None while open."""

    start: int
    parent: int | None
    end: int | None = None
    closed: bool = False  # the closing fence was seen (it starts at ``end - 3``)


class _Parser:
    """Incremental scanner of the assistant text for tags, fences and blank lines.

    It keeps only an unscanned tail (the last few characters a partial tag or a
    trailing blank-line run could still complete), so each feed costs O(new text).
    Every decision depends only on the text so far, never on how it was split.
    """

    def __init__(self) -> None:
        self.blocks: list[_Block] = []
        self.fences: list[_Fence] = []
        self._tail, self._tail_start = "", 0  # unscanned text and where it starts
        self._pos = 0  # everything before this has been scanned
        self._space_from = 0  # start of the trailing whitespace run

    @property
    def thinking(self) -> bool:
        return bool(self.blocks) and self.blocks[-1].end is None

    @property
    def open_fence(self) -> _Fence | None:
        return self.fences[-1] if self.fences and self.fences[-1].end is None else None

    def feed(self, text: str) -> None:
        n = self._tail_start + len(self._tail)
        if text.strip():
            self._space_from = n + len(text.rstrip())
        self._tail += text
        while match := self._pattern().search(self._tail, self._pos - self._tail_start):
            self._on(match.group(), self._tail_start + match.start(), self._tail_start + match.end())
        n += len(text)
        resume = max(self._pos, min(n - _HOLD, self._space_from))
        self._tail, self._tail_start = self._tail[resume - self._tail_start :], resume

    def _pattern(self) -> re.Pattern[str]:
        if not self.thinking:
            return _IN_ANSWER
        return _IN_THINK_CODE if self.open_fence else _IN_THINK

    def _on(self, found: str, at: int, stop: int) -> None:
        fence = self.open_fence
        if found == _FENCE:
            if fence:
                fence.end, fence.closed = stop, True
            else:
                self.fences.append(_Fence(at, len(self.blocks) - 1 if self.thinking else None))
        elif found in (_OPEN, _CLOSE):
            if fence:
                fence.end = at  # a tag ends an open fence, unclosed
            if found == _OPEN:
                self.blocks.append(_Block(at, stop))
            else:
                self.blocks[-1].close, self.blocks[-1].end = at, stop
        else:
            self.blocks[-1].breaks.append(stop)
        self._pos = stop


def signature_ranges(text: str) -> list[tuple[int, int]]:
    """Character ranges of ``def``/``class`` headers in ``text``, keyword to final colon."""
    ranges = []
    for match in _SIGNATURE.finditer(text):
        depth = 0
        for i in range(match.end(1) - 1, len(text)):
            char = text[i]
            if char in "([{":
                depth += 1
            elif char in ")]}":
                depth = max(0, depth - 1)
            elif depth == 0 and char in ":\n":
                if char == ":":
                    ranges.append((match.start(1), i + 1))
                break
    return ranges


class Segmenter:
    """Labels every token of a chat; the assistant part grows with :meth:`feed`.

    ``roles`` are the prompt's role spans (at most one assistant span, last); ``texts``
    one decoded piece per token so far.  Tokens from the assistant body on (or after
    the last role when there is no assistant span) are the assistant's: the initial
    ones (e.g. ``"<think>\\n"``) and every fed one.  Call :meth:`finish` when the
    assistant turn has ended, so the last answer counts as complete.
    """

    def __init__(
        self,
        roles: Sequence[RoleSpan],
        texts: Sequence[str],
        *,
        min_step_tokens: int = 8,
        protect_system: bool = True,
        protect_question: bool = True,
    ) -> None:
        _check_roles(roles, len(texts))
        self.min_step_tokens = min_step_tokens
        prompt_roles = [r for r in roles if r.role != "assistant"]
        if len(prompt_roles) < len(roles):
            self._a0 = _body(roles[-1])[0]
        else:
            self._a0 = roles[-1].end if roles else 0
        protect = {"system": protect_system, "user": protect_question}
        self._prompt_spans = self._prompt_segments(prompt_roles, texts, protect)
        self._prompt_labels = ["template"] * self._a0
        self._prompt_mask = np.zeros(self._a0, dtype=bool)
        for role in prompt_roles:
            lo, hi = _body(role)
            self._prompt_labels[lo:hi] = [role.role] * (hi - lo)
        for span in self._prompt_spans:
            self._prompt_mask[span.start : span.end] |= span.protected
            if span.kind == "signature":
                self._prompt_labels[span.start : span.end] = ["signature"] * (span.end - span.start)
        self._text = _Text()
        self._parser = _Parser()
        self._finished = False
        self.feed(texts[self._a0 :])

    @staticmethod
    def _prompt_segments(
        roles: Sequence[RoleSpan], texts: Sequence[str], protect: dict[str, bool]
    ) -> list[Span]:
        """System and user turns, and the signatures in the user's text."""
        spans, seen = [], {"system": 0, "user": 0, "signature": 0}
        for role in roles:
            spans.append(Span(role.role, seen[role.role], role.start, role.end, True, protect[role.role]))
            seen[role.role] += 1
            if role.role != "user":
                continue
            lo, hi = _body(role)
            body = _Text(texts[lo:hi])
            for a, b in signature_ranges("".join(body.pieces)):
                start, end = lo + body.token(a), lo + body.token(b)
                if end > start:
                    spans.append(Span("signature", seen["signature"], start, end, True, True))
                    seen["signature"] += 1
        return spans

    def feed(self, texts: Sequence[str]) -> None:
        """Append the text pieces of newly generated (or replayed) tokens."""
        self._text.append(texts)
        self._parser.feed("".join(texts))

    def finish(self) -> None:
        """Mark the end of the assistant turn: an open answer or fence is complete."""
        self._finished = True

    @property
    def n_tokens(self) -> int:
        return self._a0 + len(self._text.pieces)

    def _tok(self, char: int | None) -> int:
        """Absolute token boundary for an assistant-text offset (``None``: the end so far)."""
        return self.n_tokens if char is None else self._a0 + self._text.token(char)

    def spans(self) -> list[Span]:
        """All current spans sorted by start (outer spans first); nested ones included."""
        spans = self._prompt_spans + self.think_blocks() + self._tags() + self._answers() + self._codes()
        for i, block in enumerate(self._parser.blocks):
            spans += self._steps(i, block)
        return sorted(spans, key=lambda s: (s.start, -s.end, _ORDER[s.kind]))

    def think_blocks(self) -> list[Span]:
        """Think blocks in order, tags included, the last one possibly still open."""
        return [
            Span("think", i, self._tok(b.start), self._tok(b.end), b.end is not None, False)
            for i, b in enumerate(self._parser.blocks)
        ]

    def _tags(self) -> list[Span]:
        ranges = []
        for i, block in enumerate(self._parser.blocks):
            ranges.append((i, block.start, block.body))
            if block.end is not None:
                ranges.append((i, block.close, block.end))
        return _numbered("tag", [(self._tok(a), self._tok(b), True, i) for i, a, b in ranges])

    def _answers(self) -> list[Span]:
        blocks = self._parser.blocks
        ranges = [(0, blocks[0].start if blocks else None)]
        ranges += [(b.end, nxt.start) for b, nxt in zip(blocks, blocks[1:])]
        if blocks and blocks[-1].end is not None:
            ranges.append((blocks[-1].end, None))
        return _numbered(
            "answer", [(self._tok(a), self._tok(b), b is not None or self._finished, None) for a, b in ranges]
        )

    def _codes(self) -> list[Span]:
        fences = self._parser.fences
        return _numbered("code", [(self._tok(f.start), self._tok(f.end), f.closed, f.parent) for f in fences])

    def _steps(self, i: int, block: _Block) -> list[Span]:
        bounds = [self._tok(c) for c in [block.body, *block.breaks, block.close]]
        steps: list[list[int]] = []
        for lo, hi in zip(bounds, bounds[1:]):
            if steps and hi - lo < self.min_step_tokens:
                steps[-1][1] = hi
            else:
                steps.append([lo, hi])
        if len(steps) > 1 and steps[0][1] - steps[0][0] < self.min_step_tokens:
            first = steps.pop(0)
            steps[0][0] = first[0]
        complete = block.end is not None or self._finished
        return _numbered("step", [(lo, hi, complete or hi < bounds[-1], i) for lo, hi in steps])

    def labels(self) -> list[str]:
        """One label per token; the most specific wins (code > tag > think > answer)."""
        labels = self._prompt_labels + ["answer"] * (self.n_tokens - self._a0)
        for kind, spans in (("think", self.think_blocks()), ("tag", self._tags()), ("code", self._codes())):
            for span in spans:
                labels[span.start : span.end] = [kind] * (span.end - span.start)
        return labels

    def protected_mask(self) -> np.ndarray:
        """``(T,)`` bool: tokens no policy may evict."""
        return np.concatenate([self._prompt_mask, np.zeros(self.n_tokens - self._a0, dtype=bool)])

    def code_after(self, block: Span) -> str | None:
        """Source of the first complete code after a closed think block, else ``None``.

        Looks between the block and the next one: the first fenced block there
        (complete once its closing fence, the next block or :meth:`finish` is seen),
        or, with no fence, the whole answer text there once complete (unfenced code).
        """
        blocks = self._parser.blocks
        this = blocks[block.index]
        if this.end is None:
            return None
        nxt = blocks[block.index + 1].start if block.index + 1 < len(blocks) else None
        complete = nxt is not None or self._finished
        for fence in self._parser.fences:
            if fence.parent is None and this.end <= fence.start and (nxt is None or fence.start < nxt):
                return self._fence_source(fence) if fence.end is not None or complete else None
        answer = self._text.slice(this.end, self._text.n_chars if nxt is None else nxt)
        return answer if complete and answer.strip() else None

    def _fence_source(self, fence: _Fence) -> str:
        """The code inside a fence: after the info-string line, before the closing fence."""
        end = self._text.n_chars if fence.end is None else fence.end - (len(_FENCE) if fence.closed else 0)
        inner = self._text.slice(fence.start + len(_FENCE), end)
        newline = inner.find("\n")
        return inner[newline + 1 :] if newline >= 0 else inner


def _body(role: RoleSpan) -> tuple[int, int]:
    return (
        role.start if role.body_start is None else role.body_start,
        role.end if role.body_end is None else role.body_end,
    )


def _numbered(kind: str, ranges: Iterable[tuple[int, int, bool, int | None]]) -> list[Span]:
    """Unprotected spans of ``kind`` from ``(start, end, closed, parent)``, numbered, empty ones dropped."""
    spans: list[Span] = []
    for start, end, closed, parent in ranges:
        if end > start:
            spans.append(Span(kind, len(spans), start, end, closed, False, parent))
    return spans


def _check_roles(roles: Sequence[RoleSpan], n_tokens: int) -> None:
    """Role spans must be known roles, in order, disjoint, inside the text, assistant last."""
    previous_end = 0
    for i, role in enumerate(roles):
        lo, hi = _body(role)
        if role.role not in ("system", "user", "assistant"):
            raise ValueError(f"unknown role {role.role!r}")
        if role.role == "assistant" and i != len(roles) - 1:
            raise ValueError("the assistant span must be the last role span")
        if not previous_end <= role.start <= lo <= hi <= role.end:
            raise ValueError(f"role span {role} overlaps or is out of order")
        if (role.role != "assistant" and role.end > n_tokens) or lo > n_tokens:
            raise ValueError(f"role span {role} lies beyond the {n_tokens} tokens given")
        previous_end = role.end
