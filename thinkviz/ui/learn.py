"""The Learn tab's text: each registered policy's rule, source and parameters, as Markdown."""

from __future__ import annotations

import inspect

from ..policies import policy_class, policy_names
from ..policies.base import COMMON_PARAMS, Param


def _escape(text: str) -> str:
    """Markdown table cells: no pipes or newlines; tags shown as text."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def params_table(params: tuple[Param, ...]) -> str:
    rows = ["| parameter | default | range | what it does |", "|---|---|---|---|"]
    rows += [f"| `{p.name}` | {p.default} | {_escape(p.range_text)} | {_escape(p.help)} |" for p in params]
    return "\n".join(rows)


def policy_card(name: str) -> str:
    """Markdown for one policy: summary, the rule (its docstring), source, its own parameters."""
    cls = policy_class(name)
    rule = inspect.getdoc(cls) or ""
    parts = [f"### `{cls.name}`", _escape(cls.summary), f"**Rule.** {_escape(rule)}",
             f"**Source.** {_escape(cls.source)}"]
    if cls.params:
        parts.append(params_table(cls.params))
    else:
        parts.append("_No parameters beyond the common ones._")
    return "\n\n".join(parts)


def learn_markdown() -> str:
    """Every registered policy's card, after the knobs they all share."""
    intro = (
        "## How the policies decide\n\n"
        "Every policy keeps at most `budget` tokens per layer and kv-head (between compressions "
        "the cache grows to `budget + interval`). Protected spans, attention sinks and the recent "
        "window are always kept; the rest compete on the policy's score.\n\n"
        "#### Knobs every policy shares\n\n" + params_table(COMMON_PARAMS)
    )
    return "\n\n---\n\n".join([intro] + [policy_card(n) for n in policy_names()])
