"""What ThinkViz sees in a trace or transcript, without a forward pass: turns, segments, blocks.

:func:`inspect_trace` tokenizes a trace exactly as a replay does (:func:`thinkviz.measure.replay.tokenize_trace`)
and runs the segmenter over every token, fed in the pieces the engine would feed: the result is
what a run's recording would say about segments and protection, before any policy runs.  Only
the tokenizer is needed, never the weights.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from ..text.chat import token_texts
from ..policies.think_drop import block_states
from .replay import Trace, tokenize_trace
from ..text.segments import Segmenter

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def inspect_trace(
    tokenizer: PreTrainedTokenizerBase,
    max_context: int,
    trace: Trace,
    protect_system: bool = True,
    protect_question: bool = True,
) -> dict[str, Any]:
    """A JSON-able report of ``trace``.

    - ``turns``: one entry per chat turn — ``turn``, ``role``, ``start``/``end`` (token range,
      markers included), ``tokens``, ``text_tokens`` (the message text alone) and ``prefilled``
      (the whole turn is in the prompt rather than teacher-forced);
    - ``segments``: the number of spans of each kind;
    - ``think_blocks``: ``index``, ``turn``, ``start``, ``end``, ``tokens``, ``closed`` and
      ``code`` (``pending``, ``parsed`` or ``syntax error``, think_drop's ``verify=parse`` gate),
      ``tests`` (``passed``, ``failed``, ``error`` or ``none``: the verdict of the first tool turn
      after it in its reflection loop) and ``tests_passed`` (a later tool turn of that loop
      passed: think_drop's ``verify=tests`` gate);
    - ``protected_tokens``: how many tokens no policy may evict, under the two toggles;
    - ``reasoning``: the rule that found the model's think markers (``rule``, ``description``;
      :mod:`thinkviz.text.reasoning`).

    Raises :class:`~thinkviz.measure.replay.TraceError` as a replay would.
    """
    prompt, ids = tokenize_trace(tokenizer, max_context, trace)
    reasoning = prompt.reasoning
    segmenter = Segmenter(
        prompt.roles,
        prompt.texts,
        protect_system=protect_system,
        protect_question=protect_question,
        tags=(reasoning.open, reasoning.close),
    )
    segmenter.feed(token_texts(tokenizer, ids, prefix_ids=prompt.ids[-8:]))
    segmenter.finish()
    n = segmenter.n_tokens
    turns = []
    for k, role in enumerate(prompt.roles):
        open_turn = role.role == "assistant" and role.body_end is None
        end = n if open_turn else role.end
        body_start = role.start if role.body_start is None else role.body_start
        body_end = end if role.body_end is None else role.body_end
        turns.append(
            {
                "turn": k,
                "role": role.role,
                "start": role.start,
                "end": end,
                "tokens": end - role.start,
                "text_tokens": body_end - body_start,
                "prefilled": end <= len(prompt.ids),
            }
        )
    blocks = [{**block, "tokens": block["end"] - block["start"]} for block in block_states(segmenter)]
    return {
        "turns": turns,
        "segments": dict(Counter(span.kind for span in segmenter.spans())),
        "think_blocks": blocks,
        "protected_tokens": int(segmenter.protected_mask().sum()),
        "reasoning": {"rule": reasoning.rule, "description": reasoning.describe()},
    }


def format_report(name: str, model: str, report: dict[str, Any]) -> str:
    """The report as a few aligned lines of text."""
    turns = report["turns"]
    total = turns[-1]["end"] if turns else 0
    prefilled = sum(t["tokens"] for t in turns if t["prefilled"])
    head = f"{name}: {total:,} tokens with the {model} tokenizer ({prefilled:,} prefilled, "
    lines = [head + f"{total - prefilled:,} teacher-forced)", "turns:"]
    for t in turns:
        where = "prefilled" if t["prefilled"] else "replayed"
        lines.append(
            f"  {t['turn'] + 1:3d}  {t['role']:<9} {t['tokens']:6,} tokens "
            f"(text {t['text_tokens']:,})  {t['start']:,}–{t['end']:,}  {where}"
        )
    counts = ", ".join(f"{kind} {count}" for kind, count in report["segments"].items())
    lines.append(f"segments: {counts or 'none'}")
    lines.append("think blocks:" if report["think_blocks"] else "think blocks: none")
    for b in report["think_blocks"]:
        state = b["code"] if b["closed"] else f"{b['code']} (never closed)"
        lines.append(
            f"  think {b['index'] + 1:<3d} turn {b['turn'] + 1:<3d} tokens {b['start']:,}–{b['end']:,} "
            f"({b['tokens']:,})  code after it: {state}; tests after it: {b['tests']}"
        )
    lines.append(f"protected: {report['protected_tokens']:,} tokens")
    lines.append(f"reasoning: {report['reasoning']['rule']} ({report['reasoning']['description']})")
    return "\n".join(lines) + "\n"
