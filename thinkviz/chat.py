"""Chat prompts as token ids with known role spans, and incremental token decoding.

:func:`build_chat` renders ``system`` + ``user`` through the tokenizer's chat template
(or a plain ``System:/User:/Assistant:`` format when it has none), opens the assistant
turn with a prefix (``"<think>\\n"`` by default, which induces the reasoning format in
models that were not trained for it) and reports, per role, which tokens hold the turn
and which hold the message text itself (the rest are template markers).

:func:`token_texts` turns ids into per-token text pieces whose concatenation is the
decoded text, also when a character is split over several byte-level tokens; the
engine reuses it while streaming.

Character → token rule (shared with :mod:`thinkviz.segments`): a token belongs to the
span that contains its *anchor*, the first non-whitespace character of its text (its
first character when it is all whitespace).  BPE vocabularies glue leading spaces and
newlines to the next word (``" </"``, ``"\\n<"``, ``" def"``), so anchoring on the first
visible character puts such a token with the word it starts.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

REASONING_SYSTEM_PROMPT = (
    "You are a careful assistant. Before you answer, think step by step inside "
    "<think> and </think>, leaving a blank line between steps. If your reasoning "
    "needs checking, open a new <think> block to reflect and revise. After the last "
    "</think>, give the final answer; put code in a single ```python fenced block."
)

# Context tokens decoded before the first new id, so pieces that depend on their left
# neighbour (SentencePiece's leading space, a character split over tokens) come out right.
# A pending character spans at most 3 byte tokens, so 4 reach back to its start, and up
# to 3 more move the window's start out of the middle of an earlier character.
_DECODE_CONTEXT = 4
_MAX_PENDING = 3
_PENDING = "\ufffd"  # what decode() shows for an incomplete UTF-8 sequence
_PROBE = "\ue000probe\ue000"  # stands in for a message's text to find where the template puts it


@dataclass(frozen=True)
class RoleSpan:
    """Tokens ``[start, end)`` of one chat turn, template markers included.

    ``[body_start, body_end)`` are the tokens of the message text itself (``None``:
    the same as ``start`` / ``end``); tokens of the turn outside the body are template
    markers (``<|im_start|>user\\n``, ``<|im_end|>``...).  For the assistant turn the
    body begins with the assistant prefix and grows as tokens are generated.
    """

    role: str
    start: int
    end: int
    body_start: int | None = None
    body_end: int | None = None


@dataclass
class ChatPrompt:
    """A tokenized chat: ids, one decoded text piece per id, role spans.

    ``assistant_prefix`` is the text already opened in the assistant turn (the
    last tokens of ``ids``), e.g. ``"<think>\\n"``.
    """

    ids: list[int]
    texts: list[str]
    roles: list[RoleSpan]
    assistant_prefix: str

    @property
    def text(self) -> str:
        """The whole prompt as text."""
        return "".join(self.texts)


def anchor(piece: str, start: int) -> int:
    """Character offset of a token's anchor, given its text and start offset."""
    leading = len(piece) - len(piece.lstrip())
    return start + (leading if leading < len(piece) else 0)


def token_boundary(anchors: Sequence[int], char: int) -> int:
    """Index of the first token whose anchor is at or after ``char`` (``anchors`` sorted)."""
    return bisect.bisect_left(anchors, char)


def token_texts(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], prefix_ids: Sequence[int] = ()
) -> list[str]:
    """Per-token text pieces of ``ids``, decoded after ``prefix_ids`` (the tokens before).

    Each piece is the text the token completes: a token holding the first bytes of a
    multi-byte character gets ``""`` and the token that completes the character gets
    all of it.  ``"".join(token_texts(tok, ids)) == tok.decode(ids)`` unless ``ids``
    ends inside a character, whose bytes then stay pending (text that decodes to
    U+FFFD counts as pending too).  Streaming works the same way: call with the new ids
    and at least the previous 7 as ``prefix_ids``; bytes left pending by the previous
    call are emitted with the token that completes them, so the streamed pieces equal
    the batch ones (for valid UTF-8; a run of undecodable bytes longer than the
    context may come out with a different number of U+FFFD).  Cost is O(len(ids))
    decodes of a few tokens each.
    """
    all_ids = [*prefix_ids, *ids]

    def decode(lo: int, hi: int) -> str:
        return tokenizer.decode(all_ids[lo:hi], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    read = len(prefix_ids)  # text of all_ids[:read] has been emitted
    start = max(0, read - _DECODE_CONTEXT)  # decoding window starts here...
    for _ in range(_MAX_PENDING):  # ...or earlier, if that is inside a character
        if start == 0 or not decode(start, read).startswith(_PENDING):
            break
        start -= 1
    while read > start and decode(start, read).endswith(_PENDING):
        read -= 1  # the previous call left these bytes pending
    done = decode(start, read)
    pieces = []
    for i in range(len(prefix_ids), len(all_ids)):
        text = decode(start, i + 1)
        if text.endswith(_PENDING):
            pieces.append("")
            continue
        pieces.append(text[len(done) :])
        start, read = read, i + 1
        done = decode(start, read)
    return pieces


Render = Callable[[list[dict[str, str]], bool], str]


def _template_render(tokenizer: PreTrainedTokenizerBase) -> Render:
    def render(messages: list[dict[str, str]], generation: bool) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)

    return render


def _plain_render(messages: list[dict[str, str]], generation: bool) -> str:
    """Fallback format for tokenizers without a chat template."""
    text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages)
    return text + ("Assistant: " if generation else "")


def _tokenize(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[list[int], list[str], list[int]]:
    """Ids of ``text``, their text pieces and their anchors as offsets into ``text``.

    Fast tokenizers report exact character offsets; otherwise offsets accumulate the
    decoded pieces (exact whenever decoding reproduces the text).
    """
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        texts = token_texts(tokenizer, ids)
    else:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        texts = token_texts(tokenizer, ids)
        ends = list(itertools.accumulate(map(len, texts)))
        offsets = list(zip([0, *ends[:-1]], ends))
    return ids, texts, [anchor(text[s:e], s) for s, e in offsets]


def _body(
    render: Render, before: list[dict[str, str]], message: dict[str, str], rendered: str
) -> tuple[int, int] | None:
    """Where ``message``'s text lies in ``rendered`` (the chat up to it), found by rendering
    a probe in its place; ``None`` when the template does not insert the text verbatim."""
    probe = render([*before, {**message, "content": _PROBE}], False)
    head, found, tail = probe.partition(_PROBE)
    content = message["content"]
    return (len(head), len(head) + len(content)) if found and rendered == head + content + tail else None


def build_chat(
    tokenizer: PreTrainedTokenizerBase, system: str | None, user: str, assistant: str = "<think>\n"
) -> ChatPrompt:
    """Tokenize a system + user chat and open the assistant turn with ``assistant``.

    ``system=None`` sends no system message (a template may still insert its own,
    which then counts as template markers of the user turn).  Role spans come from
    rendering growing message lists: turn ``k`` is the text the ``k``-th message adds,
    its body is where the message text sits in it; the assistant turn starts where the
    generation prompt begins.  The whole text is tokenized once and character
    boundaries map to tokens by the anchor rule (module docstring).  A template that
    already opens the assistant turn with ``assistant`` (DeepSeek-R1 distills add
    ``"<think>\\n"``) does not get it twice.
    """
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": user})
    render = _template_render(tokenizer) if getattr(tokenizer, "chat_template", None) else _plain_render
    prompt = render(messages, True)
    text = prompt if prompt.endswith(assistant) else prompt + assistant
    ids, texts, anchors = _tokenize(tokenizer, text)

    def at(char: int) -> int:
        return token_boundary(anchors, char)

    roles, turn_start = [], 0
    for k, message in enumerate(messages):
        rendered = render(messages[: k + 1], False)
        if not prompt.startswith(rendered):
            raise ValueError("the chat template renders a conversation prefix inconsistently")
        body = _body(render, messages[:k], message, rendered) or (turn_start, len(rendered))
        roles.append(RoleSpan(message["role"], at(turn_start), at(len(rendered)), at(body[0]), at(body[1])))
        turn_start = len(rendered)
    assistant_start = len(text) - len(assistant)
    roles.append(RoleSpan("assistant", at(turn_start), len(ids), at(assistant_start), None))
    return ChatPrompt(ids=ids, texts=texts, roles=roles, assistant_prefix=assistant)
