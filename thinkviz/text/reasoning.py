"""Each model's own way of thinking, read from its chat template and tokenizer.

Reasoning models mark their thinking differently, and ThinkViz's segments (think blocks, steps,
answer) must follow the model's own markers:

- **Qwen3**: ``<think>…</think>``, written only when the template's ``enable_thinking`` is on
  (the template renders ``<think>\\n\\n</think>`` for it when off); the rule switches it on.
- **R1 distills** (DeepSeek-R1-Distill-Qwen/Llama, QwQ): the generation prompt itself ends with
  ``<think>\\n``, so the turn is open before the model writes a token.
- **gpt-oss** (OpenAI's harmony format): no think tags; the reasoning is the ``analysis``
  channel, ``<|channel|>analysis<|message|>…<|end|>``, and the answer the ``final`` channel.
  The analysis channel's opening and its ``<|end|>`` play the think tags' roles.
- **think tags**: a template or vocabulary that knows ``<think>`` without either rule above.
- **prompted**: none of these (the embedded SmolLM2): the reasoning system prompt asks for
  ``<think>`` and the model may or may not comply.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
HARMONY_OPEN, HARMONY_CLOSE = "<|channel|>analysis<|message|>", "<|end|>"
_PROBE = [{"role": "user", "content": "\ue000"}]


@dataclass(frozen=True)
class ReasoningFormat:
    """How a model marks its thinking: ``rule`` (one of the module docstring's), the markers that
    open and close a think block, the assistant prefix that opens one, and the chat-template
    arguments the rule needs (Qwen3's ``enable_thinking``)."""

    rule: str
    open: str = THINK_OPEN
    close: str = THINK_CLOSE
    template_kwargs: Mapping[str, object] = field(default_factory=dict)

    @property
    def native(self) -> bool:
        """Whether the model has a reasoning format of its own (else it is prompted to think)."""
        return self.rule != "prompted"

    @property
    def prefix(self) -> str:
        """What opens the assistant turn so that it starts thinking."""
        return self.open + ("\n" if self.open == THINK_OPEN else "")

    @property
    def switchable(self) -> bool:
        """Whether thinking can be switched on and off (Qwen3's ``enable_thinking``)."""
        return "enable_thinking" in self.template_kwargs

    def describe(self) -> str:
        """One line for a status line or ``inspect``."""
        if self.template_kwargs.get("enable_thinking") is False:
            return "Qwen3 template: thinking switched off (enable_thinking off)"
        return _DESCRIPTIONS[self.rule]


_DESCRIPTIONS = {
    "qwen3": "Qwen3 template: <think> with enable_thinking on",
    "r1": "R1-style template: the assistant turn opens with <think>",
    "harmony": "harmony channels: analysis → think, final → answer",
    "think-tags": "the model's own <think> tags",
    "prompted": "no reasoning format of its own: prompted to think in <think> tags",
}
PROMPTED = ReasoningFormat("prompted")


def _templates(tokenizer: PreTrainedTokenizerBase) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "\n".join(map(str, template.values())) if isinstance(template, Mapping) else str(template)


def reasoning_format(tokenizer: PreTrainedTokenizerBase, enable_thinking: bool = True) -> ReasoningFormat:
    """The rule ``tokenizer``'s chat template and vocabulary follow (module docstring), checked in
    the order harmony, Qwen3, R1, think tags.  ``enable_thinking=False`` leaves Qwen3's thinking
    off (the template then closes an empty think block itself)."""
    template = _templates(tokenizer)
    if "<|channel|>" in template and "analysis" in template:
        return ReasoningFormat("harmony", HARMONY_OPEN, HARMONY_CLOSE)
    if "enable_thinking" in template:
        return ReasoningFormat("qwen3", template_kwargs={"enable_thinking": enable_thinking})
    if template and _opens_think(tokenizer):
        return ReasoningFormat("r1")
    if THINK_OPEN in template or _in_vocabulary(tokenizer, THINK_OPEN):
        return ReasoningFormat("think-tags")
    return PROMPTED


def _in_vocabulary(tokenizer: PreTrainedTokenizerBase, token: str) -> bool:
    """Whether ``token`` is one token of ``tokenizer``'s vocabulary: looked up, not by building the
    whole vocabulary (``get_vocab()``: a 49k-entry dict for SmolLM2, 40 ms on every chat built)."""
    lookup = getattr(tokenizer, "convert_tokens_to_ids", None)
    if lookup is None:
        return False
    found = lookup(token)
    return found is not None and found != getattr(tokenizer, "unk_token_id", None)


def _opens_think(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the template's generation prompt already ends inside an open ``<think>``."""
    try:
        rendered = tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - jinja's raise_exception() and friends: no rule then
        return False
    return rendered.rstrip().endswith(THINK_OPEN)
