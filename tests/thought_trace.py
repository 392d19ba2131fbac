"""A small hand-written reflection loop shared by the thought-aware policy tests: three think
blocks, each followed by a code draft; the second draft does not parse."""

SYSTEM = "You are a careful coding assistant. Think inside <think> tags, then write the code."
QUESTION = (
    "Fix utils/geometry.py:\n"
    "def area(r: float) -> float:\n"
    "    return 2 * pi * r\n"
    "It should return the area of a circle."
)
TRACE = """The function returns the circumference, not the area.

The area of a circle is pi times the radius squared.
</think>

```python
def area(r: float) -> float:
    return 3.14159 * r ** 2
```

Tests: 3.14159 is not precise enough for the tolerance.

<think>
Use math.pi instead of a literal for the constant.

I will import math at the top of the module.
</think>

```python
def area(r: float) -> float
    return math.pi * r ** 2
```

SyntaxError: expected ':'

<think>
The colon after the signature is missing again.

Add the import and the colon this time.
</think>

```python
import math


def area(r: float) -> float:
    return math.pi * r ** 2
```

All tests pass now.
"""


def chat_and_trace(tokenizer):
    """``(ChatPrompt, trace ids)`` for the loop above (the prompt opens the first block)."""
    from thinkviz.text.chat import build_chat

    prompt = build_chat(tokenizer, SYSTEM, QUESTION)
    return prompt, list(tokenizer(TRACE, add_special_tokens=False)["input_ids"])


# The same loop as an agent transcript: each draft is followed by a tool message with its test
# run, and the user speaks again before the last loop (with a second signature to protect).
MESSAGES = (
    ("system", SYSTEM),
    ("user", QUESTION),
    (
        "assistant",
        "<think>\nThe function returns the circumference, not the area.\n\n"
        "The area of a circle is pi times the radius squared.\n</think>\n\n"
        "```python\ndef area(r: float) -> float:\n    return 3.14159 * r ** 2\n```\n\n"
        "$ pytest -q tests/test_geometry.py",
    ),
    (
        "tool",
        "F.\nFAILED tests/test_geometry.py::test_area - assert 3.14159 == 3.141592653589793 ± 1e-09\n"
        "1 failed, 1 passed in 0.02s",
    ),
    (
        "assistant",
        "<think>\nUse math.pi instead of a literal for the constant.\n\n"
        "I will import math at the top of the module.\n</think>\n\n"
        "```python\ndef area(r: float) -> float\n    return math.pi * r ** 2\n```\n\n"
        "$ pytest -q tests/test_geometry.py",
    ),
    ("tool", "E   SyntaxError: expected ':'\n1 error in 0.05s"),
    ("user", "While you are at it, add the circumference too:\ndef circumference(r: float) -> float:\n    ..."),
    (
        "assistant",
        "<think>\nThe colon after the signature is missing again.\n\n"
        "Add the import, the colon and the second function this time.\n</think>\n\n"
        "```python\nimport math\n\n\ndef area(r: float) -> float:\n    return math.pi * r ** 2\n\n\n"
        "def circumference(r: float) -> float:\n    return 2 * math.pi * r\n```\n\n"
        "$ pytest -q tests/test_geometry.py",
    ),
    ("tool", "...\n3 passed in 0.02s"),
    ("assistant", "All tests pass now."),
)


def conversation_and_trace(loaded):
    """``(ChatPrompt, trace ids)`` for the transcript above: the prompt ends with the first user
    turn and carries every later turn's role span (``ahead``)."""
    from thinkviz.measure.replay import prepare_transcript
    from thinkviz.text.transcript import Message

    return prepare_transcript(loaded, [Message(role, content) for role, content in MESSAGES])
