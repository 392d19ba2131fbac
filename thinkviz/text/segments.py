"""Token → segment labels for a chat whose assistant reasons inside ``<think>`` blocks.

A chat is a sequence of turns given by its role spans (:class:`~thinkviz.text.chat.RoleSpan`): a
single system + question + assistant turn, or a whole multi-turn conversation with tool
output and several user and assistant turns.  Every turn is a segment of its role
(``system``, ``user``, ``tool``, ``assistant``) and every segment carries its turn index
(``Span.turn``); the assistant turn a chat is still generating has no segment of its own,
only its think, answer and code segments.  The tokens around a message's text are template
markers; *signatures* (``def``/``class`` headers of code in any
user turn) are always protected.  Each assistant turn's text is parsed incrementally as
tokens stream in, and numbered across the whole conversation:

- ``<think>…</think>`` blocks, numbered in order (reflection loops).  Blocks do not
  nest: an inner ``<think>`` is text; a ``</think>`` with no open block is text; a
  block that never closes stays open (``closed=False``).
- reasoning steps inside a block: split after blank lines (outside code fences);
  steps shorter than ``min_step_tokens`` are merged into the previous one (a short
  first step into the next).
- fenced code (```` ``` ````…```` ``` ````), in the answer or inside thinking.  Tags win over
  fences: a ``<think>`` (or, inside thinking, ``</think>``) ends an open fence unclosed.
- answer text: everything in the assistant turn outside think blocks.

Nothing spans two turns: a block or fence left open at the end of its assistant turn ends
there (still ``closed=False``), and the code that settles a block (:meth:`Segmenter.code_after`)
is looked for in the block's own turn only.

A model with another reasoning format has its own pair of markers in the tags' place
(:mod:`thinkviz.text.reasoning`: gpt-oss's analysis channel opens with
``<|channel|>analysis<|message|>`` and closes with ``<|end|>``).

Detection runs on the concatenated text, so tags split over tokens (``<th`` +
``ink>``) are found; character offsets map back to tokens with the anchor rule of
:mod:`thinkviz.text.chat`: a token belongs to the span containing its first
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
from .reasoning import THINK_CLOSE, THINK_OPEN

_FENCE = "```"
_BREAK = r"\n[^\S\n]*\n\s*(?=\S)"  # a blank line; the next step starts at the next visible char

_SIGNATURE = re.compile(
    r"^[^\S\n]*((?:async[^\S\n]+)?(?:def[^\S\n]+\w+[^\S\n]*\(|class[^\S\n]+\w+[^\S\n]*[(:]))", re.MULTILINE
)
ROLES = ("system", "user", "assistant", "tool")
_KINDS = ["system", "user", "tool", "assistant", "signature", "think", "tag", "step", "answer", "code"]
_ORDER = {kind: i for i, kind in enumerate(_KINDS)}  # ties in spans(): the outer kind first


@dataclass(frozen=True)
class Span:
    """Tokens ``[start, end)`` (absolute positions) of one segment.

    ``index`` is the ordinal among the spans of its kind (for steps: within their
    think block).  ``closed``: for think/code, the closing tag/fence has been seen;
    for the other kinds, the span will not grow any more.  ``parent``: for
    step/code/tag, the index of the think block containing it, else ``None``.
    ``turn``: the index of the chat turn (role span) it lies in; tokens after the last
    role span form one more turn.
    """

    kind: str
    index: int
    start: int
    end: int
    closed: bool
    protected: bool
    parent: int | None = None
    turn: int | None = None

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

    def __init__(self, tags: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)) -> None:
        self.tags = tags
        opening, closing = map(re.escape, tags)
        self._in_answer = re.compile(f"{opening}|{_FENCE}")  # also inside answer code
        self._in_think = re.compile(f"{closing}|{_FENCE}|{_BREAK}")
        self._in_think_code = re.compile(f"{closing}|{_FENCE}")
        self._hold = max(map(len, tags)) - 1  # longest partial match a scan may have to wait on
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
        resume = max(self._pos, min(n - self._hold, self._space_from))
        self._tail, self._tail_start = self._tail[resume - self._tail_start :], resume

    def _pattern(self) -> re.Pattern[str]:
        if not self.thinking:
            return self._in_answer
        return self._in_think_code if self.open_fence else self._in_think

    def _on(self, found: str, at: int, stop: int) -> None:
        fence = self.open_fence
        if found == _FENCE:
            if fence:
                fence.end, fence.closed = stop, True
            else:
                self.fences.append(_Fence(at, len(self.blocks) - 1 if self.thinking else None))
        elif found in self.tags:
            if fence:
                fence.end = at  # a tag ends an open fence, unclosed
            if found == self.tags[0]:
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


@dataclass
class _Region:
    """A stretch of tokens with one meaning: a turn's text (``role`` set), or template markers.

    Tokens ``[lo, hi)`` (``hi=None``: open, it takes every later token).  A text region keeps
    its pieces; an assistant region also parses them.
    """

    lo: int
    hi: int | None
    role: str | None = None
    turn: int | None = None
    text: _Text = field(default_factory=_Text)
    parser: _Parser | None = None
    signatures: tuple[int, list[tuple[int, int]]] = (-1, [])  # (pieces seen, ranges) cache

    def tok(self, char: int | None) -> int:
        """Absolute token boundary for a region-text offset (``None``: the end so far)."""
        return self.lo + (len(self.text.pieces) if char is None else self.text.token(char))


class Segmenter:
    """Labels every token of a chat; tokens arrive with :meth:`feed`.

    ``roles`` are the chat's role spans in order; ``texts`` one decoded piece per token so
    far.  An assistant span without ``body_end`` is *open* (it must be the last): it takes
    every token from its body start on, e.g. the ``"<think>\\n"`` prefix and every generated
    token.  Spans marked ``ahead`` may lie beyond ``texts``: their tokens come later, as a
    replay teacher-forces a transcript, and are labelled as they arrive.  Tokens after the
    last span (when it is not open) are the assistant's.  Call :meth:`finish` when the
    assistant turn has ended, so the last answer counts as complete.  ``tags`` are the markers
    that open and close a think block: ``<think>`` / ``</think>`` unless the model has its own
    (:class:`~thinkviz.text.reasoning.ReasoningFormat`: harmony's analysis channel and ``<|end|>``).
    """

    def __init__(
        self,
        roles: Sequence[RoleSpan],
        texts: Sequence[str],
        *,
        min_step_tokens: int = 8,
        protect_system: bool = True,
        protect_question: bool = True,
        tags: tuple[str, str] = (THINK_OPEN, THINK_CLOSE),
    ) -> None:
        _check_roles(roles, len(texts))
        self.min_step_tokens = min_step_tokens
        self._roles = list(roles)
        self._protect = protect = {"system": protect_system, "user": protect_question}
        self._regions: list[_Region] = []
        self._guards: list[tuple[int, int | None]] = []  # protected token ranges of whole turns
        edge = 0
        for turn, role in enumerate(roles):
            lo, hi = _body(role)
            is_open = role.role == "assistant" and role.body_end is None
            for a, b, meaning in (
                (edge, role.start, None),
                (role.start, lo, None),
                (lo, None if is_open else hi, role.role),
                (hi, role.end, None),
            ):
                if meaning is not None or (b is not None and b > a):
                    self._regions.append(_Region(a, b, meaning, turn))
                if is_open and meaning is not None:
                    break
            if protect.get(role.role):
                self._guards.append((role.start, None if is_open else role.end))
            edge = role.end
        if not roles or roles[-1].body_end is not None or roles[-1].role != "assistant":
            self._regions.append(_Region(edge, None, "assistant", len(roles)))
        for region in self._regions:
            if region.role == "assistant":
                region.parser = _Parser(tags)
        self._labels: list[str] = []
        self._cursor = 0  # the region the next token falls in
        self._finished = False
        self.feed(texts)

    def feed(self, texts: Sequence[str]) -> None:
        """Append the text pieces of the next tokens (prompt, generated or replayed)."""
        i, n = 0, len(texts)
        while i < n:
            region = self._regions[self._cursor]
            while region.hi is not None and self.n_tokens >= region.hi:
                self._cursor += 1
                region = self._regions[self._cursor]
            take = n - i if region.hi is None else min(n - i, region.hi - self.n_tokens)
            group = texts[i : i + take]
            self._labels += [_BASE.get(region.role, region.role) if region.role else "template"] * take
            if region.role is not None:
                region.text.append(group)
                if region.parser is not None:
                    region.parser.feed("".join(group))
            i += take

    def finish(self) -> None:
        """Mark the end of the assistant turn: an open answer or fence is complete."""
        self._finished = True

    @property
    def n_tokens(self) -> int:
        return len(self._labels)

    def _complete(self, region: _Region) -> bool:
        """The region's text will not grow: finished, or all its tokens are in."""
        return self._finished or (region.hi is not None and self.n_tokens >= region.hi)

    def _assistant_regions(self) -> list[_Region]:
        return [r for r in self._regions if r.parser is not None and r.lo <= self.n_tokens]

    def spans(self) -> list[Span]:
        """All current spans sorted by start (outer spans first); nested ones included."""
        spans = self._turns() + self._signatures() + self.think_blocks()
        spans += self._tags() + self._answers() + self._codes()
        for i, (region, block) in enumerate(self._blocks()):
            spans += self._steps(i, region, block)
        return sorted(spans, key=lambda s: (s.start, -s.end, _ORDER[s.kind]))

    def _turns(self) -> list[Span]:
        """One span per turn that has begun, markers included.  An open assistant turn (the one
        being generated) has none: its think, answer and code spans are all there is to it."""
        n, spans, seen = self.n_tokens, [], dict.fromkeys(ROLES, 0)
        for turn, role in enumerate(self._roles):
            end = min(role.end, n)
            if end <= role.start or (role.role == "assistant" and role.body_end is None):
                continue
            protected = self._protect.get(role.role, False)
            spans.append(Span(role.role, seen[role.role], role.start, end, role.end <= n, protected, turn=turn))
            seen[role.role] += 1
        return spans

    def messages(self, role: str) -> list[tuple[Span, str]]:
        """Each turn of ``role`` begun so far: its span (markers included, ``closed`` once all its
        tokens are in) and its message text so far."""
        texts = {r.turn: "".join(r.text.pieces) for r in self._regions if r.role == role}
        return [(span, texts.get(span.turn, "")) for span in self._turns() if span.kind == role]

    def _signatures(self) -> list[Span]:
        """``def``/``class`` headers in the user turns' text so far (complete headers only)."""
        spans = []
        for region in self._regions:
            if region.role != "user":
                continue
            pieces = len(region.text.pieces)
            if region.signatures[0] != pieces:
                region.signatures = (pieces, signature_ranges("".join(region.text.pieces)))
            for a, b in region.signatures[1]:
                start, end = region.tok(a), region.tok(b)
                if end > start:
                    spans.append(Span("signature", len(spans), start, end, True, True, turn=region.turn))
        return spans

    def _blocks(self) -> list[tuple[_Region, _Block]]:
        """Every think block with its region, numbered across the conversation by position."""
        return [(region, block) for region in self._assistant_regions() for block in region.parser.blocks]

    def think_blocks(self) -> list[Span]:
        """Think blocks in order, tags included, the last one possibly still open."""
        return [
            Span("think", i, r.tok(b.start), r.tok(b.end), b.end is not None, False, turn=r.turn)
            for i, (r, b) in enumerate(self._blocks())
        ]

    def _tags(self) -> list[Span]:
        ranges = []
        for i, (region, block) in enumerate(self._blocks()):
            ranges.append((region.tok(block.start), region.tok(block.body), True, i, region.turn))
            if block.end is not None:
                ranges.append((region.tok(block.close), region.tok(block.end), True, i, region.turn))
        return _numbered("tag", ranges)

    def _answers(self) -> list[Span]:
        ranges = []
        for region in self._assistant_regions():
            blocks = region.parser.blocks
            pairs = [(0, blocks[0].start if blocks else None)]
            pairs += [(b.end, nxt.start) for b, nxt in zip(blocks, blocks[1:])]
            if blocks and blocks[-1].end is not None:
                pairs.append((blocks[-1].end, None))
            complete = self._complete(region)
            ranges += [(region.tok(a), region.tok(b), b is not None or complete, None, region.turn) for a, b in pairs]
        return _numbered("answer", ranges)

    def _codes(self) -> list[Span]:
        ranges, first = [], 0
        for region in self._assistant_regions():
            for fence in region.parser.fences:
                parent = None if fence.parent is None else first + fence.parent
                ranges.append((region.tok(fence.start), region.tok(fence.end), fence.closed, parent, region.turn))
            first += len(region.parser.blocks)
        return _numbered("code", ranges)

    def _steps(self, i: int, region: _Region, block: _Block) -> list[Span]:
        bounds = [region.tok(c) for c in [block.body, *block.breaks, block.close]]
        steps: list[list[int]] = []
        for lo, hi in zip(bounds, bounds[1:]):
            if steps and hi - lo < self.min_step_tokens:
                steps[-1][1] = hi
            else:
                steps.append([lo, hi])
        if len(steps) > 1 and steps[0][1] - steps[0][0] < self.min_step_tokens:
            first = steps.pop(0)
            steps[0][0] = first[0]
        complete = block.end is not None or self._complete(region)
        return _numbered("step", [(lo, hi, complete or hi < bounds[-1], i, region.turn) for lo, hi in steps])

    def labels(self) -> list[str]:
        """One label per token; the most specific wins (code > tag > think > answer, signature > user)."""
        labels = list(self._labels)
        overlays = (
            ("signature", self._signatures()),
            ("think", self.think_blocks()),
            ("tag", self._tags()),
            ("code", self._codes()),
        )
        for kind, spans in overlays:
            for span in spans:
                labels[span.start : span.end] = [kind] * (span.end - span.start)
        return labels

    def protected_mask(self) -> np.ndarray:
        """``(T,)`` bool: tokens no policy may evict."""
        n = self.n_tokens
        mask = np.zeros(n, dtype=bool)
        for a, b in self._guards:
            mask[a : n if b is None else min(b, n)] = True
        for span in self._signatures():
            mask[span.start : span.end] = True
        return mask

    def code_after(self, block: Span) -> str | None:
        """Source of the first complete code after a closed think block in its turn, else ``None``.

        Looks between the block and the next one of the same assistant turn (or the turn's
        end): the first fenced block there (complete once its closing fence, the next block
        or the end of the turn is seen), or, with no fence, the whole answer text there once
        complete (unfenced code).
        """
        region, this = self._blocks()[block.index]
        if this.end is None:
            return None
        blocks = region.parser.blocks
        k = blocks.index(this)
        nxt = blocks[k + 1].start if k + 1 < len(blocks) else None
        complete = nxt is not None or self._complete(region)
        for fence in region.parser.fences:
            if fence.parent is None and this.end <= fence.start and (nxt is None or fence.start < nxt):
                return _fence_source(region.text, fence) if fence.end is not None or complete else None
        answer = region.text.slice(this.end, region.text.n_chars if nxt is None else nxt)
        return answer if complete and answer.strip() else None


_BASE = {"assistant": "answer"}  # the label of a turn's text before any overlay; else its role


def _fence_source(text: _Text, fence: _Fence) -> str:
    """The code inside a fence: after the info-string line, before the closing fence."""
    end = text.n_chars if fence.end is None else fence.end - (len(_FENCE) if fence.closed else 0)
    inner = text.slice(fence.start + len(_FENCE), end)
    newline = inner.find("\n")
    return inner[newline + 1 :] if newline >= 0 else inner


def _body(role: RoleSpan) -> tuple[int, int]:
    return (
        role.start if role.body_start is None else role.body_start,
        role.end if role.body_end is None else role.body_end,
    )


def _numbered(kind: str, ranges: Iterable[tuple[int, int, bool, int | None, int | None]]) -> list[Span]:
    """Unprotected spans of ``kind`` from ``(start, end, closed, parent, turn)``, numbered, empty ones dropped."""
    spans: list[Span] = []
    for start, end, closed, parent, turn in ranges:
        if end > start:
            spans.append(Span(kind, len(spans), start, end, closed, False, parent, turn))
    return spans


def _check_roles(roles: Sequence[RoleSpan], n_tokens: int) -> None:
    """Role spans must be known roles, in order, disjoint and inside the text (unless ``ahead``);
    an open assistant span must be the last."""
    previous_end = 0
    for i, role in enumerate(roles):
        lo, hi = _body(role)
        is_open = role.role == "assistant" and role.body_end is None
        if role.role not in ROLES:
            raise ValueError(f"unknown role {role.role!r} (known: {', '.join(ROLES)})")
        if is_open and i != len(roles) - 1:
            raise ValueError("an open assistant span (no body end) must be the last role span")
        if not previous_end <= role.start <= lo <= hi <= role.end:
            raise ValueError(f"role span {role} overlaps or is out of order")
        if not role.ahead and ((not is_open and role.end > n_tokens) or lo > n_tokens):
            raise ValueError(f"role span {role} lies beyond the {n_tokens} tokens given")
        previous_end = role.end
