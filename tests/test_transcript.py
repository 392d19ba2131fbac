"""Transcript loader: JSON, JSONL and ROLE: lines; tolerated extras; every bad input named."""

from __future__ import annotations

import json

import pytest

from thinkviz.measure.replay import load_trace
from thinkviz.text.transcript import Message, TraceError, decode_trace, is_transcript, parse_transcript

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Fix área() — it returns 2πr 😀"},
    {"role": "assistant", "content": "<think>\nπr² it is.\n</think>\n```python\nx = 1\n```"},
    {"role": "tool", "content": ""},
    {"role": "assistant", "content": "No output: the command printed nothing."},
    {"role": "assistant", "content": "Done."},
]
EXPECTED = tuple(Message(m["role"], m["content"]) for m in CHAT)


def test_json_list_and_messages_object_and_jsonl_read_the_same():
    as_list = json.dumps(CHAT, ensure_ascii=False)
    as_object = json.dumps({"messages": CHAT, "model": "qwen3"})
    as_lines = "\n".join(json.dumps(m) for m in CHAT) + "\n\n"
    assert parse_transcript(as_list) == parse_transcript(as_object) == parse_transcript(as_lines) == EXPECTED


def test_plain_text_role_lines():
    text = (
        "SYSTEM: Be brief.\n"
        "USER: Fix área() — it returns 2πr 😀\n\n"
        "ASSISTANT:\n<think>\nπr² it is.\n</think>\n```python\nx = 1\n```\n\n"
        "TOOL:\n\n"
        "ASSISTANT: No output: the command printed nothing.\n"
        "ASSISTANT:   Done.   \n\n"
    )
    assert parse_transcript(text) == EXPECTED
    # a role word inside a line, or in lower case, does not start a message
    body = parse_transcript("USER: a\nsee USER: b\nuser: c")
    assert body == (Message("user", "a\nsee USER: b\nuser: c"),)


def test_no_system_prompt_and_consecutive_assistant_turns():
    messages = parse_transcript(
        '[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},'
        ' {"role": "assistant", "content": "b"}]'
    )
    assert [m.role for m in messages] == ["user", "assistant", "assistant"]


def test_content_parts_roles_case_and_extra_fields():
    messages = parse_transcript(
        json.dumps(
            [
                {
                    "role": "User",
                    "content": [{"type": "text", "text": "part one"}, {"text": "part two"}],
                    "name": "ana",
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "bash", "arguments": '{"cmd": "pytest -q"}'},
                        },
                        {"function": {"name": "read", "arguments": {"path": "a.py"}}},
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "3 passed"},
                {"role": "assistant", "content": "ok", "tool_calls": []},
            ]
        )
    )
    assert messages[0] == Message("user", "part one\npart two")
    assert messages[1].content == (
        '<tool_call>\n{"name": "bash", "arguments": {"cmd": "pytest -q"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>'
    )
    assert messages[2:] == (Message("tool", "3 passed"), Message("assistant", "ok"))


@pytest.mark.parametrize(
    "text, reason",
    [
        ('[{"role": "bot", "content": "x"}]', r"message 1 of 1: unknown role 'bot'"),
        (
            '[{"role": "user", "content": "x"}, {"role": "user", "content": "  "}]',
            r"message 2 of 2: the user message is empty",
        ),
        (
            '[{"role": "user", "content": 3}]',
            r"message 1 of 1: 'content' must be a string or a list of text parts, got int",
        ),
        ('[{"role": 1, "content": "x"}]', r"message 1 of 1: 'role' must be a string, got int"),
        ('["user: hi"]', r"message 1 of 1: a message must be an object"),
        ('{"messages": "hi"}', r"messages must be a list, got str"),
        ('{"turns": []}', r"needs a 'messages' list"),
        ("[]", r"has no messages"),
        (
            '[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]',
            r"content part 1 has type 'image_url'",
        ),
        ('[{"role": "user", "content": [{"type": "text"}]}]', r"content part 1 must be"),
        (
            '[{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]',
            r"message 1 is an assistant message: a transcript starts with a system or user message",
        ),
        ('[{"role": "tool", "content": "x"}]', r"message 1 is a tool message"),
        ('[{"role": "system", "content": "x"}]', r"has no user message"),
        ('[{"role": "user", "content": "x"},', r"not valid JSON: .* at line 1"),
        (
            '{"role": "user", "content": "x"}\n{"role": "assistant", "content": }',
            r"line 2 of the transcript is not a JSON object",
        ),
        (
            '[{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": "ls"}]',
            r"message 2 of 2: 'tool_calls' must be a list",
        ),
        (
            '[{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"x": 1}]}]',
            r"tool call 1 needs a function name",
        ),
        (
            '[{"role": "user", "content": "q"}, {"role": "assistant", "content": null}]',
            r"message 2 of 2: the assistant message is empty",
        ),
        ("Hello\nUSER: x", r"line 1 of the transcript comes before its first SYSTEM:"),
        ("USER: hi\n\nASSISTANT:\n\nTOOL: x", r"message 2 of 3 \(line 3, ASSISTANT:\): the assistant message is empty"),
    ],
)
def test_bad_transcripts_name_the_message_and_the_reason(text, reason):
    with pytest.raises(TraceError, match=reason):
        parse_transcript(text)


def test_a_presets_continuation_may_start_with_any_message():
    messages = parse_transcript("ASSISTANT: a\nTOOL: b", continues=True)
    assert [m.role for m in messages] == ["assistant", "tool"]


def test_transcripts_are_told_from_assistant_text():
    assert is_transcript("", "chat.JSONL") and is_transcript("[", "x.md") and is_transcript("\ufeff\n USER: hi")
    assert is_transcript("ASSISTANT:\n<think>") and is_transcript('{"messages": []}')
    assert not is_transcript("<think>\nUSER: is this a role line?\n</think>")
    assert not is_transcript("user: lower case is text")


@pytest.mark.parametrize(
    "data, reason",
    [(b"\x00\x01binary", "binary"), ("caf\u00e9".encode("latin-1"), "not UTF-8"), (b" \n ", "is empty")],
)
def test_undecodable_bytes_are_refused(data, reason):
    with pytest.raises(TraceError, match=reason):
        decode_trace(data, "the upload")


def test_load_trace_reads_transcript_files_and_applies_overrides(tmp_path):
    path = tmp_path / "agent.jsonl"
    path.write_text("\n".join(json.dumps(m, ensure_ascii=False) for m in CHAT), encoding="utf-8")
    trace = load_trace(str(path))
    assert (trace.name, trace.system, trace.question, trace.text) == ("agent", "Be brief.", CHAT[1]["content"], "")
    assert trace.messages == EXPECTED
    other = load_trace(str(path), question="Why?", system="Be kind.")
    assert [m.content for m in other.messages[:2]] == ["Be kind.", "Why?"] and other.question == "Why?"
    plain = tmp_path / "agent.md"
    plain.write_text("USER: q\nASSISTANT: a\n", encoding="utf-8")
    with_system = load_trace(str(plain), system="S")
    assert [m.role for m in with_system.messages] == ["system", "user", "assistant"]
    bad = tmp_path / "bad.json"
    bad.write_text('[{"role": "assistant", "content": "a"}]', encoding="utf-8")
    with pytest.raises(TraceError, match="starts with a system or user message"):
        load_trace(str(bad))
