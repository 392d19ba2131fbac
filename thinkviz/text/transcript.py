"""Trace sources: reading trace files, and transcripts (multi-turn conversations) in three forms.

A *transcript* is a list of :class:`Message` — ``system``, ``user``, ``assistant`` or ``tool`` —
as an agent framework or a reasoning model's chat log saves it.  :func:`parse_transcript` reads
any of:

- **JSON**: a list of messages, or an object ``{"messages": [...]}``;
- **JSONL**: one message object per line (blank lines are skipped);
- **plain text**: a line starting with ``SYSTEM:``, ``USER:``, ``ASSISTANT:`` or ``TOOL:``
  begins a new message; the rest of that line and the following lines are its content
  (spaces after the colon, the line break of an otherwise empty ``ROLE:`` line and
  whitespace at the end of a message are dropped).  Every such
  line starts a message, so content that has lines beginning like that needs JSON.

A message object is ``{"role": ..., "content": ...}`` in the usual chat shape.  ``content`` may be
a string, a list of ``{"type": "text", "text": ...}`` parts (joined with newlines, as vLLM does)
or ``null`` for an assistant message that only calls tools.  Other fields (``name``,
``tool_call_id``, ...) are tolerated and ignored, except ``tool_calls`` on an assistant message:
each call is appended to the content as the text a Hermes/Qwen-style model writes for it,
``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``, so the tokens the model produced
for it are in the replay.

Rules (violations raise :class:`TraceError` naming the message and the reason): roles are one
of the four above (case-insensitive); content must not be empty, except a tool's output (a
command may print nothing); a transcript starts with a system or user message and holds at
least one user message.  A preset's trace file may instead *continue* its preset's chat
(``continues=True``): it may then start with any message, and the preset's system prompt and
question are put before it.

This module also reads trace files for :mod:`thinkviz.measure.replay` (:func:`read_trace_file`) and
decides whether a text is a transcript or a plain assistant trace (:func:`is_transcript`).
Nothing here needs a tokenizer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
MAX_TRACE_FILE_BYTES = 4 * 1024 * 1024
_ROLE_LINE = re.compile(r"^(SYSTEM|USER|ASSISTANT|TOOL):[^\S\n]?", re.MULTILINE)
_TRANSCRIPT_SUFFIXES = (".json", ".jsonl")


class TraceError(ValueError):
    """A trace or transcript cannot be replayed (unreadable, malformed, empty, too long); the
    one-line message says why, and for a transcript which message."""


@dataclass(frozen=True)
class Message:
    """One turn of a transcript: its ``role`` (one of :data:`ROLES`) and its text."""

    role: str
    content: str


def read_trace_file(path: str | Path) -> str:
    """The text of a UTF-8 trace file; :class:`TraceError` for missing, binary, non-UTF-8 or empty files."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace file {path} does not exist")
    if path.stat().st_size > MAX_TRACE_FILE_BYTES:
        raise TraceError(f"trace file {path} is larger than {MAX_TRACE_FILE_BYTES // 2**20} MiB")
    return decode_trace(path.read_bytes(), f"trace file {path}")


def decode_trace(data: bytes, what: str = "the trace") -> str:
    """``data`` as UTF-8 text (a BOM is dropped); :class:`TraceError` naming ``what`` for binary,
    non-UTF-8 or empty data."""
    if b"\x00" in data:
        raise TraceError(f"{what} is binary (it contains NUL bytes), not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        ) from None
    if not text.strip():
        raise TraceError(f"{what} is empty")
    return text


def is_transcript(text: str, name: str = "") -> bool:
    """Whether a trace is a transcript: a ``.json`` / ``.jsonl`` ``name``, text that starts like
    JSON, or plain text whose first non-blank line is a ``ROLE:`` line.  Anything else is the
    assistant's text of a single-turn trace."""
    if name.lower().endswith(_TRANSCRIPT_SUFFIXES):
        return True
    head = text.lstrip("\ufeff \t\r\n")
    return head.startswith(("[", "{")) or _ROLE_LINE.match(head) is not None


def parse_transcript(text: str, *, continues: bool = False) -> tuple[Message, ...]:
    """The messages of a transcript in any of the three forms (module docstring).

    The form is told from the text: ``[`` starts JSON, ``{`` JSON or JSONL, anything else is
    plain text.  ``continues``: the transcript continues a preset's chat (see the module
    docstring).  Raises :class:`TraceError`.
    """
    head = text.lstrip("\ufeff \t\r\n")
    if head.startswith("["):
        raw, where = _json_document(text), _item
    elif head.startswith("{"):
        try:
            document = json.loads(text)
        except json.JSONDecodeError:
            raw, where = _json_lines(text)
        else:
            raw, where = _messages_of(document), _item
    else:
        return _check(_plain_messages(text), continues)
    return _check(tuple(_message(item, where(i, raw)) for i, item in enumerate(raw)), continues)


def join_chat(system: str | None, question: str, messages: Sequence[Message]) -> tuple[Message, ...]:
    """``messages`` as one whole conversation.

    A transcript that starts with its own system or user message is one already; one that
    starts with an assistant or tool message continues the chat of ``system`` (``None``: no
    system message) and ``question``, which are put before it.  :class:`TraceError` when that
    question is needed and empty.
    """
    if messages and messages[0].role in ("system", "user"):
        return tuple(messages)
    if not question.strip():
        raise TraceError(
            "the question is empty: a transcript that starts with an assistant or tool message continues the question"
        )
    head = () if system is None else (Message("system", system),)
    return (*head, Message("user", question), *messages)


def _item(index: int, raw: Sequence[Any]) -> str:
    return f"message {index + 1} of {len(raw)}"


def _json_document(text: str) -> list[Any]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"the transcript is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    return _messages_of(document)


def _messages_of(document: Any) -> list[Any]:
    if isinstance(document, dict):
        if "messages" not in document:
            raise TraceError("a JSON transcript object needs a 'messages' list")
        document = document["messages"]
    if not isinstance(document, list):
        raise TraceError(f"the transcript's messages must be a list, got {_type(document)}")
    if not document:
        raise TraceError("the transcript has no messages")
    return document


def _json_lines(text: str) -> tuple[list[Any], Any]:
    """JSONL: one message per non-blank line; the ``where`` names the line."""
    items, lines = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise TraceError(
                f"line {number} of the transcript is not a JSON object: {exc.msg} at column {exc.colno} "
                "(JSONL needs one message per line)"
            ) from None
        lines.append(number)
    if not items:
        raise TraceError("the transcript has no messages")
    return items, lambda index, raw: f"message {index + 1} of {len(raw)} (line {lines[index]})"


def _plain_messages(text: str) -> tuple[Message, ...]:
    text = text.lstrip("\ufeff")
    starts = list(_ROLE_LINE.finditer(text))
    if not starts:
        raise TraceError("the transcript has no SYSTEM:, USER:, ASSISTANT: or TOOL: line")
    before = text[: starts[0].start()]
    if before.strip():
        line = before[: len(before) - len(before.lstrip())].count("\n") + 1
        raise TraceError(f"line {line} of the transcript comes before its first SYSTEM:/USER:/ASSISTANT:/TOOL: line")
    messages = []
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        first_line, newline, rest = text[match.end() : end].partition("\n")
        content = (f"{first_line.lstrip()}{newline}{rest}" if first_line.strip() else rest).rstrip()
        role = match.group(1).lower()
        line = text[: match.start()].count("\n") + 1
        messages.append(_checked(role, content, f"message {i + 1} of {len(starts)} (line {line}, {match.group(1)}:)"))
    return tuple(messages)


def _message(item: Any, where: str) -> Message:
    if not isinstance(item, dict):
        raise TraceError(f"{where}: a message must be an object with 'role' and 'content', got {_type(item)}")
    role = item.get("role")
    if not isinstance(role, str):
        raise TraceError(f"{where}: 'role' must be a string, got {_type(role)}")
    role = role.strip().lower()
    if role not in ROLES:
        raise TraceError(f"{where}: unknown role {item['role']!r} (use one of: {', '.join(ROLES)})")
    content = _content(item.get("content"), where)
    calls = item.get("tool_calls")
    if calls is not None and role == "assistant":
        content = "\n".join(part for part in (content, _tool_calls(calls, where)) if part)
    return _checked(role, content, where)


def _content(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for k, part in enumerate(value, 1):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict) and part.get("type", "text") != "text":
                raise TraceError(
                    f"{where}: content part {k} has type {part.get('type')!r}; only text parts can be replayed"
                )
            else:
                raise TraceError(
                    f"{where}: content part {k} must be {{'type': 'text', 'text': '...'}}, got {_type(part)}"
                )
        return "\n".join(texts)
    raise TraceError(f"{where}: 'content' must be a string or a list of text parts, got {_type(value)}")


def _tool_calls(calls: Any, where: str) -> str:
    """The text of an assistant's tool calls, one ``<tool_call>`` block each."""
    if not isinstance(calls, list):
        raise TraceError(f"{where}: 'tool_calls' must be a list, got {_type(calls)}")
    blocks = []
    for k, call in enumerate(calls, 1):
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise TraceError(f"{where}: tool call {k} needs a function name")
        arguments = function.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        name = json.dumps(function["name"], ensure_ascii=False)
        blocks.append(f'<tool_call>\n{{"name": {name}, "arguments": {arguments}}}\n</tool_call>')
    return "\n".join(blocks)


def _checked(role: str, content: str, where: str) -> Message:
    if role != "tool" and not content.strip():
        raise TraceError(f"{where}: the {role} message is empty (only a tool's output may be)")
    return Message(role, content)


def _check(messages: tuple[Message, ...], continues: bool) -> tuple[Message, ...]:
    if not continues:
        first = messages[0]
        if first.role not in ("system", "user"):
            raise TraceError(
                f"message 1 is a{'n' if first.role == 'assistant' else ''} {first.role} message: "
                "a transcript starts with a system or user message"
            )
        if not any(m.role == "user" for m in messages):
            raise TraceError("the transcript has no user message")
    return messages


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__
