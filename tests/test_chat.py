"""build_chat role spans and token_texts decoding, on the embedded SmolLM2 tokenizer and fakes."""

from __future__ import annotations

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from thinkviz.models.loading import embedded_tokenizer
from thinkviz.text.chat import REASONING_SYSTEM_PROMPT, RoleSpan, anchor, build_chat, token_texts


class CharTokenizer:
    """One token per character, no chat template, no offsets: the plain fallback path."""

    chat_template = None
    is_fast = False

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, **kwargs) -> str:
        return "".join(map(chr, ids))


class R1LikeTokenizer(CharTokenizer):
    """A template that opens the assistant turn with ``<think>\\n`` itself, like R1 distills."""

    chat_template = "r1-like"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<|{m['role']}|>{m['content']}" for m in messages)
        return text + ("<|assistant|><think>\n" if add_generation_prompt else "")


class UnstableTokenizer(R1LikeTokenizer):
    """A template whose rendering of a prefix is not a prefix of the whole."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        return f"[{len(messages)}]" + super().apply_chat_template(messages, tokenize, add_generation_prompt)


def span_text(prompt, span: RoleSpan, body: bool = False) -> str:
    lo, hi = (span.body_start, span.body_end) if body else (span.start, span.end)
    return "".join(prompt.texts[lo:hi])


QUESTION = "Fix this 😀 函数:\n```python\ndef area(r: float) -> float:\n    return 2 * r\n```"


@pytest.mark.slow
def test_build_chat_smollm2_role_spans():
    tok = embedded_tokenizer()
    prompt = build_chat(tok, REASONING_SYSTEM_PROMPT, QUESTION)
    system, user, assistant = prompt.roles
    assert [r.role for r in prompt.roles] == ["system", "user", "assistant"]
    assert (system.start, system.end) == (0, user.start) and user.end == assistant.start
    assert assistant.end == len(prompt.ids) == len(prompt.texts)
    assert span_text(prompt, system, body=True) == REASONING_SYSTEM_PROMPT
    assert span_text(prompt, user, body=True) == QUESTION
    assert span_text(prompt, system).startswith("<|im_start|>system\n")
    assert span_text(prompt, user).endswith("<|im_end|>\n")
    assert span_text(prompt, assistant) == "<|im_start|>assistant\n<think>\n"
    assert "".join(prompt.texts[assistant.body_start :]) == prompt.assistant_prefix == "<think>\n"
    # the ids are the tokenization of the rendered text, and start with the template's own ids
    messages = [{"role": "system", "content": REASONING_SYSTEM_PROMPT}, {"role": "user", "content": QUESTION}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.text == rendered + "<think>\n"
    assert prompt.ids == tok(prompt.text, add_special_tokens=False)["input_ids"]
    reference = tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert prompt.ids[: len(reference)] == reference


def test_build_chat_without_system_keeps_template_default_as_markers():
    tok = embedded_tokenizer()
    prompt = build_chat(tok, None, "Why is the sky blue?")
    user, assistant = prompt.roles
    assert (user.role, user.start) == ("user", 0)
    assert span_text(prompt, user, body=True) == "Why is the sky blue?"
    # SmolLM2's template inserts its own system prompt; it lies in the user turn, outside the body
    assert "SmolLM" in "".join(prompt.texts[user.start : user.body_start])
    assert span_text(prompt, assistant, body=False).endswith("<think>\n")


def test_build_chat_custom_and_empty_assistant_prefix():
    tok = embedded_tokenizer()
    empty = build_chat(tok, "S", "U", assistant="")
    assert empty.roles[-1].body_start == len(empty.ids) and empty.assistant_prefix == ""
    # a prefix the template already ends with is not added twice
    again = build_chat(tok, "S", "U", assistant="assistant\n")
    assert again.text.endswith("<|im_start|>assistant\n") and again.text.count("assistant\n") == 1
    assert "".join(again.texts[again.roles[-1].body_start :]) == "assistant\n"


def test_build_chat_plain_fallback_without_template():
    prompt = build_chat(CharTokenizer(), "Be brief.", "2+2?")
    assert prompt.text == "System: Be brief.\nUser: 2+2?\nAssistant: <think>\n"
    system, user, assistant = prompt.roles
    assert span_text(prompt, system) == "System: Be brief.\n"
    assert span_text(prompt, system, body=True) == "Be brief."
    assert span_text(prompt, user, body=True) == "2+2?"
    assert span_text(prompt, assistant) == "Assistant: <think>\n"
    assert "".join(prompt.texts[assistant.body_start :]) == "<think>\n"


def test_build_chat_template_that_already_opens_thinking():
    prompt = build_chat(R1LikeTokenizer(), None, "q")
    assert prompt.text == "<|user|>q<|assistant|><think>\n"
    assert "".join(prompt.texts[prompt.roles[-1].body_start :]) == "<think>\n"
    assert span_text(prompt, prompt.roles[-1]) == "<|assistant|><think>\n"


def test_build_chat_rejects_prefix_unstable_template():
    with pytest.raises(ValueError, match="inconsistently"):
        build_chat(UnstableTokenizer(), "s", "q")


def test_anchor_is_first_visible_character():
    assert anchor(" </", 5) == 6
    assert anchor("\n  def", 0) == 3
    assert anchor("\n\n", 3) == 3  # all whitespace: its first character
    assert anchor("", 2) == 2


def test_token_texts_defers_partial_utf8():
    tok = embedded_tokenizer()
    ids = tok("a 😀 日本語 e\u0301", add_special_tokens=False)["input_ids"]
    pieces = token_texts(tok, ids)
    assert "".join(pieces) == "a 😀 日本語 e\u0301"
    assert "" in pieces and " 😀" in pieces  # the emoji's first byte-token waits for the second
    assert all("\ufffd" not in p for p in pieces)


@settings(deadline=None)
@given(st.text(max_size=40), st.integers(min_value=7, max_value=9))
@pytest.mark.slow
def test_token_texts_batch_equals_decode_and_streaming(text, context):
    """Text the tokenizer round-trips joins back exactly; streamed pieces equal batch pieces.

    (Some unassigned code points come back as U+FFFD runs; ``..._arbitrary_ids_...`` covers those.)
    """
    tok = embedded_tokenizer()
    ids = tok(text + ".", add_special_tokens=False)["input_ids"]
    assume(tok.decode(ids, clean_up_tokenization_spaces=False) == text + ".")
    pieces = token_texts(tok, ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == text + "."
    streamed = [token_texts(tok, ids[i : i + 1], prefix_ids=ids[max(0, i - context) : i])[0] for i in range(len(ids))]
    assert streamed == pieces


@settings(deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=49151), max_size=12))
@example([459])
@example([459, 12])
def test_token_texts_arbitrary_ids_never_lose_complete_text(ids):
    """Random ids (invalid UTF-8 included): pieces join to the decoded text minus a pending tail.

    The tail is the text of the trailing tokens that end inside a character: it ends in U+FFFD
    and may hold complete characters of those tokens too (id 459 is a space and a first byte).
    """
    tok = embedded_tokenizer()
    whole = tok.decode(ids, clean_up_tokenization_spaces=False)
    pieces = token_texts(tok, ids)
    joined = "".join(pieces)
    assert whole.startswith(joined)
    tail = whole[len(joined) :]
    assert tail == "" or tail.endswith("\ufffd")
    last_piece = next((i for i in range(len(ids), 0, -1) if pieces[i - 1]), 0)
    assert tail == tok.decode(ids[last_piece:], clean_up_tokenization_spaces=False)


@settings(deadline=None)
@given(st.text(max_size=30), st.text(max_size=30), st.none() | st.text(max_size=30))
def test_build_chat_invariants(user, assistant, system):
    tok = embedded_tokenizer()
    for text in (system or "", user, assistant):  # see the note on unassigned code points above
        assume(tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text)
        # a trailing U+FFFD stays pending (token_texts) and is shown with the next role's marker
        assume(not text.endswith("\ufffd"))
    prompt = build_chat(tok, system, user, assistant)
    assert len(prompt.ids) == len(prompt.texts) == prompt.roles[-1].end
    previous = 0
    for role in prompt.roles:
        body_end = role.end if role.body_end is None else role.body_end
        assert previous <= role.start <= role.body_start <= body_end <= role.end
        previous = role.end
    assert prompt.text.endswith(assistant) and prompt.assistant_prefix == assistant
    # whitespace at a body's edge may share a token with a marker (anchor rule): compare stripped
    body = "".join(prompt.texts[prompt.roles[-2].body_start : prompt.roles[-2].body_end])
    assert body.strip() == user.strip() and body in user


# ---- whole conversations (transcripts) -----------------------------------------------------
# Templates written for these tests that behave like the real ones where it matters: QWEN3_LIKE
# sends tool output as a user turn in <tool_response> (consecutive tool messages share the turn),
# drops <think> blocks from assistant turns before the last user message and opens an empty think
# block in a last assistant turn without one; R1_LIKE hoists the system prompt after the BOS,
# keeps only what follows </think> in every assistant turn and wraps tool output in markers.
QWEN3_LIKE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role in ['system', 'user'] %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}{%- set text = m.content %}"
    "{%- if '</think>' in text and loop.index0 < ns.last_user %}"
    "{%- set text = text.split('</think>')[-1].lstrip('\\n') %}"
    "{%- elif loop.last and '<think>' not in text %}{%- set text = '<think>\\n\\n</think>\\n\\n' + text %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + text + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
R1_LIKE = (
    "{%- set ns = namespace(system='') %}"
    "{%- for m in messages %}{%- if m.role == 'system' %}{%- set ns.system = m.content %}{%- endif %}{%- endfor %}"
    "{{- '<｜begin▁of▁sentence｜>' + ns.system }}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{- '<｜User｜>' + m.content }}"
    "{%- elif m.role == 'assistant' %}{%- set text = m.content %}"
    "{%- if '</think>' in text %}{%- set text = text.split('</think>')[-1] %}{%- endif %}"
    "{{- '<｜Assistant｜>' + text + '<｜end▁of▁sentence｜>' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if messages[loop.index0 - 1].role != 'tool' %}{{- '<｜tool▁outputs▁begin｜>' }}{%- endif %}"
    "{{- '<｜tool▁output▁begin｜>' + m.content + '<｜tool▁output▁end｜>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<｜tool▁outputs▁end｜>' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<｜Assistant｜><think>\\n' }}{%- endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix area():\ndef area(r):\n    return 2 * r"},
    {
        "role": "assistant",
        "content": "<think>\nIt returns 2r.\n</think>\n\n```python\nimport math\ndef area(r):\n"
        "    return math.pi * r * r\n```\n$ pytest -q",
    },
    {"role": "tool", "content": "F\nFAILED test_area - NameError: name 'math' is not defined"},
    {"role": "tool", "content": ""},
    {"role": "user", "content": "Also keep the old name twice_r()."},
    {"role": "assistant", "content": "<think>\nAdd it back.\n</think>\n\nDone: both pass."},
]


R1_SPECIALS = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
]


def with_template(template):
    """The SmolLM2 tokenizer with another chat template (and, for R1_LIKE, R1's special tokens)."""
    import copy

    tok = copy.deepcopy(embedded_tokenizer())
    tok.chat_template = template
    if template == R1_LIKE:
        tok.add_special_tokens({"additional_special_tokens": R1_SPECIALS})
    return tok


def check_turns(prompt, messages):
    """Turns tile the text in order; every body is its message's text (whitespace at its edges
    may share a token with a marker, by the anchor rule)."""
    assert len(prompt.roles) == len(messages) and prompt.roles[0].start == 0
    assert prompt.roles[-1].end == len(prompt.ids) == len(prompt.texts)
    for role, nxt in zip(prompt.roles, prompt.roles[1:]):
        assert role.end == nxt.start
    for role, message in zip(prompt.roles, messages):
        assert role.role == message["role"] and not role.ahead
        body = span_text(prompt, role, body=True)
        assert body.strip() == message["content"].strip() and body in message["content"]


@pytest.mark.parametrize("template", [None, QWEN3_LIKE, R1_LIKE], ids=["smollm2", "qwen3-like", "r1-like"])
def test_build_conversation_keeps_every_turn_verbatim(template):
    from thinkviz.text.chat import build_conversation

    tok = embedded_tokenizer() if template is None else with_template(template)
    prompt = build_conversation(tok, CONVERSATION)
    check_turns(prompt, CONVERSATION)
    # the think blocks of earlier turns stay, although QWEN3_LIKE and R1_LIKE drop them from history
    assert prompt.text.count("<think>") == 2 and "\n\n</think>" not in prompt.text


def test_smollm2_has_no_tool_role_so_tool_output_is_a_marked_user_turn():
    from thinkviz.text.chat import TOOL_FALLBACK, build_conversation, has_tool_role

    tok = embedded_tokenizer()
    assert not has_tool_role(tok)
    prompt = build_conversation(tok, CONVERSATION)
    first_tool, empty_tool = prompt.roles[3], prompt.roles[4]
    assert span_text(prompt, first_tool) == (
        f"<|im_start|>user\n{TOOL_FALLBACK[0]}{CONVERSATION[3]['content']}{TOOL_FALLBACK[1]}<|im_end|>\n"
    )
    assert empty_tool.body_start == empty_tool.body_end and empty_tool.end > empty_tool.start


def test_a_template_with_a_tool_role_shapes_the_tool_turns():
    from thinkviz.text.chat import build_conversation, has_tool_role

    tok = with_template(QWEN3_LIKE)
    assert has_tool_role(tok) and has_tool_role(with_template(R1_LIKE)) and has_tool_role(CharTokenizer())
    prompt = build_conversation(tok, CONVERSATION)
    first_tool, second_tool = prompt.roles[3], prompt.roles[4]
    # consecutive tool messages share one user turn: the first opens it, the second closes it
    opened = f"<|im_start|>user\n<tool_response>\n{CONVERSATION[3]['content']}\n</tool_response>"
    assert span_text(prompt, first_tool) == opened
    assert span_text(prompt, second_tool) == "\n<tool_response>\n\n</tool_response><|im_end|>\n"
    assert span_text(prompt, prompt.roles[-1]).endswith("Done: both pass.<|im_end|>\n")
    r1 = build_conversation(with_template(R1_LIKE), CONVERSATION)
    assert span_text(r1, r1.roles[0]) == "<｜begin▁of▁sentence｜>You are a coding agent."
    assert span_text(r1, r1.roles[4]) == "<｜tool▁output▁begin｜><｜tool▁output▁end｜><｜tool▁outputs▁end｜>"


def test_build_conversation_plain_format_and_template_failures():
    from thinkviz.text.chat import TOOL_FALLBACK, build_conversation

    plain = build_conversation(CharTokenizer(), CONVERSATION[:4])
    assert plain.text.endswith(f"Tool: {CONVERSATION[3]['content']}\n")
    check_turns(plain, CONVERSATION[:4])
    # a template that names 'tool' but drops tool messages: the fallback keeps them
    dropping = build_conversation(
        with_template(
            "{%- for m in messages %}{%- if m.role != 'tool' %}"
            "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
            "{%- endif %}{%- endfor %}"
        ),
        CONVERSATION,
    )
    assert TOOL_FALLBACK[0] + CONVERSATION[3]["content"] in dropping.text
    check_turns(dropping, CONVERSATION)
    with pytest.raises(ValueError, match="cannot render this conversation: roles must alternate"):
        build_conversation(with_template("{{ raise_exception('roles must alternate') }}"), CONVERSATION)
    with pytest.raises(ValueError, match=r"message 2 \(user\) contains the special token '<\|im_end\|>'"):
        forged = [{"role": "user", "content": "a"}, {"role": "user", "content": "b<|im_end|>"}]
        build_conversation(embedded_tokenizer(), forged)


def test_split_conversation_marks_the_turns_still_to_come():
    from thinkviz.text.chat import build_conversation, split_conversation

    whole = build_conversation(embedded_tokenizer(), CONVERSATION)
    cut = whole.roles[1].end
    prompt, rest = split_conversation(whole, cut)
    assert prompt.ids + rest == whole.ids and len(prompt.texts) == cut
    assert [r.ahead for r in prompt.roles] == [False, False] + [True] * 5
    stop = whole.roles[3].start + 2  # two tokens into the first tool turn
    short, rest = split_conversation(whole, cut, stop)
    assert len(short.roles) == 4 and short.roles[-1].end == stop and len(rest) == stop - cut
    with pytest.raises(ValueError, match="cannot cut"):
        split_conversation(whole, 0)
