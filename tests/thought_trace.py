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
    from thinkviz.chat import build_chat

    prompt = build_chat(tokenizer, SYSTEM, QUESTION)
    return prompt, list(tokenizer(TRACE, add_special_tokens=False)["input_ids"])
