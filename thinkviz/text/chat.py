"""Chat prompts as token ids with known role spans, and incremental token decoding.

:func:`build_chat` renders ``system`` + ``user`` through the tokenizer's chat template
(or a plain ``System:/User:/Assistant:`` format when it has none), opens the assistant
turn with a prefix (``"<think>\\n"`` by default, which induces the reasoning format in
models that were not trained for it) and reports, per role, which tokens hold the turn
and which hold the message text itself (the rest are template markers).

:func:`build_conversation` does the same for a whole multi-turn conversation (system, user,
assistant and tool messages, as a transcript holds them); :func:`split_conversation` cuts it
into the prompt a replay prefills and the ids it teacher-forces after it.

:func:`token_texts` turns ids into per-token text pieces whose concatenation is the
decoded text, also when a character is split over several byte-level tokens; the
engine reuses it while streaming.

Character → token rule (shared with :mod:`thinkviz.text.segments`): a token belongs to the
span that contains its *anchor*, the first non-whitespace character of its text (its
first character when it is all whitespace).  BPE vocabularies glue leading spaces and
newlines to the next word (``" </"``, ``"\\n<"``, ``" def"``), so anchoring on the first
visible character puts such a token with the word it starts.
"""

from __future__ import annotations

import bisect
import itertools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .reasoning import PROMPTED, ReasoningFormat, reasoning_format

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
# Where a chat template has no tool role, a tool's output is sent as a user message wrapped in
# these markers (the convention Qwen's templates use for tool responses); the wrapper counts
# as template markers and the output itself stays labelled ``tool``.
TOOL_FALLBACK = ("<tool_response>\n", "\n</tool_response>")
_TOOL_ROLE = re.compile(r"""["']tool["']""")  # a template that handles role "tool" names it in quotes


@dataclass(frozen=True)
class RoleSpan:
    """Tokens ``[start, end)`` of one chat turn, template markers included.

    ``[body_start, body_end)`` are the tokens of the message text itself (``None``:
    the same as ``start`` / ``end``); tokens of the turn outside the body are template
    markers (``<|im_start|>user\\n``, ``<|im_end|>``...).  For the assistant turn the
    body begins with the assistant prefix and grows as tokens are generated.
    ``ahead``: the turn lies (partly) after the tokens a prompt holds; its tokens are fed
    later, as a replay teacher-forces them (see :func:`split_conversation`).
    """

    role: str
    start: int
    end: int
    body_start: int | None = None
    body_end: int | None = None
    ahead: bool = False


@dataclass
class ChatPrompt:
    """A tokenized chat: ids, one decoded text piece per id, role spans.

    ``assistant_prefix`` is the text already opened in the assistant turn (the
    last tokens of ``ids``), e.g. ``"<think>\\n"``.  ``reasoning``: how the model marks its
    thinking (:mod:`thinkviz.text.reasoning`), which the segmenter follows.
    """

    ids: list[int]
    texts: list[str]
    roles: list[RoleSpan]
    assistant_prefix: str
    reasoning: ReasoningFormat = PROMPTED

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


def token_texts(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], prefix_ids: Sequence[int] = ()) -> list[str]:
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


def _template_render(tokenizer: PreTrainedTokenizerBase, reasoning: ReasoningFormat = PROMPTED) -> Render:
    def render(messages: list[dict[str, str]], generation: bool) -> str:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation, **reasoning.template_kwargs
        )

    return render


def _plain_render(messages: list[dict[str, str]], generation: bool) -> str:
    """Fallback format for tokenizers without a chat template."""
    text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages)
    return text + ("Assistant: " if generation else "")


def _tokenize(
    tokenizer: PreTrainedTokenizerBase, text: str
) -> tuple[list[int], list[str], list[int], list[tuple[int, int]]]:
    """Ids of ``text``, their text pieces, their anchors and their ``(start, end)`` character
    offsets into ``text``.

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
    return ids, texts, [anchor(text[s:e], s) for s, e in offsets], [(int(s), int(e)) for s, e in offsets]


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
    tokenizer: PreTrainedTokenizerBase,
    system: str | None,
    user: str,
    assistant: str | None = None,
    reasoning: ReasoningFormat | None = None,
) -> ChatPrompt:
    """Tokenize a system + user chat and open the assistant turn with ``assistant``.

    ``reasoning`` (default: :func:`~thinkviz.text.reasoning.reasoning_format` of the tokenizer)
    passes its template arguments (Qwen3's ``enable_thinking``) and gives ``assistant``'s
    default: its opening marker (``"<think>\\n"``, or harmony's analysis channel), nothing where
    Qwen3's thinking is switched off.

    ``system=None`` sends no system message (a template may still insert its own,
    which then counts as template markers of the user turn).  Role spans come from
    rendering growing message lists: turn ``k`` is the text the ``k``-th message adds,
    its body is where the message text sits in it; the assistant turn starts where the
    generation prompt begins.  The whole text is tokenized once and character
    boundaries map to tokens by the anchor rule (module docstring).  A template that
    already opens the assistant turn with ``assistant`` (DeepSeek-R1 distills add
    ``"<think>\\n"``) does not get it twice.
    """
    reasoning = reasoning or reasoning_format(tokenizer)
    if assistant is None:
        assistant = "" if reasoning.template_kwargs.get("enable_thinking") is False else reasoning.prefix
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": user})
    render = _template_render(tokenizer, reasoning) if getattr(tokenizer, "chat_template", None) else _plain_render
    prompt = render(messages, True)
    text = prompt if prompt.endswith(assistant) else prompt + assistant
    ids, texts, anchors, _ = _tokenize(tokenizer, text)

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
    return ChatPrompt(ids=ids, texts=texts, roles=roles, assistant_prefix=assistant, reasoning=reasoning)


def has_tool_role(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer's chat template renders ``tool`` messages itself.

    A template that handles the role compares it with the string ``'tool'`` (Qwen, DeepSeek,
    Llama 3, Mistral templates do); SmolLM2's template writes any role name it is given, which
    the model never saw for tools, so it has none.  The plain format (no template) writes
    ``Tool: ...`` lines.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return True
    sources = template.values() if isinstance(template, Mapping) else [template]
    return any(_TOOL_ROLE.search(str(source)) for source in sources)


def build_conversation(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, str] | object]
) -> ChatPrompt:
    """Tokenize a whole conversation, one :class:`RoleSpan` per message, in order.

    ``messages`` are mappings or objects with ``role`` (system, user, assistant, tool) and
    ``content``.  Every message's text is kept verbatim, also where a template rewrites
    history (Qwen3 and the R1 distills drop ``<think>`` blocks from earlier assistant turns):
    the conversation is what the KV cache held while the turns were appended one by one.  To
    get that, the template renders the conversation with every content replaced by a unique
    placeholder (and a trailing user placeholder, so no assistant turn is the last one a
    template treats specially), then the texts go back in.  Turn ``k`` runs from the end of
    turn ``k - 1`` to the end of the markers the template closes message ``k`` with; tool
    messages on a template without a tool role use :data:`TOOL_FALLBACK`.  Raises
    ``ValueError`` (naming the message) when the template drops or reorders a message or a
    text holds one of the tokenizer's special tokens.
    """
    turns = [(_field(m, "role"), _field(m, "content")) for m in messages]
    if not turns:
        raise ValueError("the conversation has no messages")
    specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if t]
    for k, (role, content) in enumerate(turns, 1):
        found = next((t for t in specials if t in content), None)
        if found is not None:
            raise ValueError(f"message {k} ({role}) contains the special token {found!r} of the model's tokenizer")
    reasoning = reasoning_format(tokenizer)
    render = _template_render(tokenizer, reasoning) if getattr(tokenizer, "chat_template", None) else _plain_render
    text, spans = _render_verbatim(render, turns, has_tool_role(tokenizer))
    ids, texts, anchors, offsets = _tokenize(tokenizer, text)

    def at(char: int) -> int:
        return token_boundary(anchors, char)

    def turn_end(char: int, body_end: int) -> int:
        """Like ``at``, but a token the boundary falls inside goes to the next turn (a marker
        both turns' texts begin alike, e.g. ``<tool_output_end>`` vs ``<tool_output_begin>``)."""
        end = at(char)
        if end and offsets[end - 1][0] < char < offsets[end - 1][1]:
            end -= 1
        return max(end, body_end)

    roles, start = [], 0
    for (role, _), (_, body_start, body_end, end) in zip(turns, spans):
        lo, hi = at(body_start), at(body_end)
        roles.append(RoleSpan(role, start, turn_end(end, hi), max(lo, start), hi))
        start = roles[-1].end
    return ChatPrompt(ids=ids, texts=texts, roles=roles, assistant_prefix="", reasoning=reasoning)


def split_conversation(chat: ChatPrompt, cut: int, stop: int | None = None) -> tuple[ChatPrompt, list[int]]:
    """The prompt to prefill (``chat``'s first ``cut`` tokens) and the ids after it, up to ``stop``.

    Every role span is kept, cut at ``stop``; those reaching past ``cut`` are marked ``ahead``,
    so a :class:`~thinkviz.text.segments.Segmenter` built from the prompt knows every turn the
    replay will feed.  Spans starting at or after ``stop`` are dropped.
    """
    stop = len(chat.ids) if stop is None else min(stop, len(chat.ids))
    if not 0 < cut <= stop:
        raise ValueError(f"cannot cut a conversation of {len(chat.ids)} tokens at {cut} (stop {stop})")
    roles = []
    for role in chat.roles:
        if role.start >= stop:
            break
        roles.append(
            replace(
                role,
                end=min(role.end, stop),
                ahead=role.end > cut,
                body_start=None if role.body_start is None else min(role.body_start, stop),
                body_end=None if role.body_end is None else min(role.body_end, stop),
            )
        )
    prompt = ChatPrompt(
        ids=chat.ids[:cut], texts=chat.texts[:cut], roles=roles, assistant_prefix="", reasoning=chat.reasoning
    )
    return prompt, chat.ids[cut:stop]


def _field(message: Mapping[str, str] | object, name: str) -> str:
    value = message.get(name) if isinstance(message, Mapping) else getattr(message, name, None)
    if not isinstance(value, str):
        raise ValueError(f"a message's {name} must be a string, got {type(value).__name__}")
    return value


def _render_verbatim(
    render: Render, turns: list[tuple[str, str]], tool_role: bool
) -> tuple[str, list[tuple[int, int, int, int]]]:
    """The conversation's text and, per message, ``(turn start, body start, body end, turn end)``
    in characters (method in :func:`build_conversation`)."""
    probes = [f"\ue000{k}\ue001" for k in range(len(turns))]
    skeleton = []
    for (role, _), probe in zip(turns, probes):
        if role == "tool" and not tool_role:
            skeleton.append({"role": "user", "content": TOOL_FALLBACK[0] + probe + TOOL_FALLBACK[1]})
        else:
            skeleton.append({"role": role, "content": probe})
    tail = "\ue000tail\ue001"
    whole = _try_render(render, [*skeleton, {"role": "user", "content": tail}], [*probes, tail])
    if whole is not None:
        limit = whole.index(tail)
    elif (whole := _try_render(render, skeleton, probes)) is not None:
        limit = len(whole)
    elif tool_role and any(role == "tool" for role, _ in turns):
        return _render_verbatim(render, turns, False)  # the template drops tool messages after all
    else:
        try:
            text = render(skeleton, False)
        except Exception as exc:  # noqa: BLE001 - jinja's raise_exception() and friends
            raise ValueError(f"the chat template cannot render this conversation: {exc}") from None
        missing = next((k for k, p in enumerate(probes) if text.count(p) != 1), None)
        if missing is None:
            raise ValueError("the chat template reorders the conversation's messages")
        raise ValueError(f"the chat template does not render message {missing + 1} ({turns[missing][0]}) once")
    bodies = []
    for probe in probes:
        start = whole.index(probe)
        bodies.append((start, start + len(probe)))
    ends = []
    for k, (_, body_end) in enumerate(bodies):
        gap = whole[body_end : bodies[k + 1][0] if k + 1 < len(bodies) else limit]
        ends.append(body_end + len(os.path.commonprefix([_closing(render, skeleton[: k + 1], probes[k]), gap])))
    # put the texts back: a skeleton offset moves by what the probes before it grew by
    pieces, cursor, shift, spans = [], 0, 0, []
    for k, ((_, content), (lo, hi)) in enumerate(zip(turns, bodies)):
        turn_start = 0 if k == 0 else ends[k - 1] + shift
        pieces += [whole[cursor:lo], content]
        body_start = lo + shift
        shift += len(content) - (hi - lo)
        spans.append((turn_start, body_start, body_start + len(content), ends[k] + shift))
        cursor = hi
    pieces.append(whole[cursor : ends[-1]])
    return "".join(pieces), spans


def _try_render(render: Render, messages: list[dict[str, str]], probes: list[str]) -> str | None:
    """The rendering of ``messages`` when it holds every probe once, in order; else ``None``."""
    try:
        text = render(messages, False)
    except Exception:  # noqa: BLE001 - a template may refuse a message order (jinja raises anything)
        return None
    places = [text.find(p) for p in probes]
    if any(text.count(p) != 1 for p in probes) or places != sorted(places):
        return None
    return text


def _closing(render: Render, messages: list[dict[str, str]], probe: str) -> str:
    """The markers the template closes the last of ``messages`` with ("" if it cannot tell)."""
    text = _try_render(render, messages, [probe])
    return "" if text is None else text[text.index(probe) + len(probe) :]
