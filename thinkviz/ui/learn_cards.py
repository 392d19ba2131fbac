"""The Learn tab's text: each registered policy's rule, source and parameters, and each KV-cache
format's rule, bits per value and source, as Markdown."""

from __future__ import annotations

import inspect
import re

from ..core.kvquant import FORMATS, KVQuant
from ..policies import policy_class, policy_names
from ..policies.base import COMMON_PARAMS, Param


_CODE = re.compile(r"(`+)(.+?)\1")  # a Markdown code span (``x < y`` in a docstring)


def _escape(text: str) -> str:
    """Markdown table cells: no pipes or newlines; tags shown as text.  Inside code spans a ``<``
    is already text (an entity there would show literally), so only the prose around them is escaped."""
    flat = " ".join(text.split()).replace("|", "\\|")
    out, last = [], 0
    for match in _CODE.finditer(flat):
        out += [flat[last : match.start()].replace("<", "&lt;").replace(">", "&gt;"), match.group(0)]
        last = match.end()
    out.append(flat[last:].replace("<", "&lt;").replace(">", "&gt;"))
    return "".join(out)


def params_table(params: tuple[Param, ...]) -> str:
    rows = ["| parameter | default | range | what it does |", "|---|---|---|---|"]
    rows += [f"| `{p.name}` | {p.default} | {_escape(p.range_text)} | {_escape(p.help)} |" for p in params]
    return "\n".join(rows)


def policy_card(name: str) -> str:
    """Markdown for one policy: summary, the rule (its docstring), what its heat shows, source, its own parameters."""
    cls = policy_class(name)
    rule = inspect.getdoc(cls) or ""
    scale = cls.score_scale
    heat = (
        f"{_escape(scale.what)}: low = {_escape(scale.low)}, high = {_escape(scale.high)}"
        if scale is not None
        else "none: the rule orders tokens without a graded score, so the token views show only what it kept"
    )
    parts = [
        f"### `{cls.name}`",
        _escape(cls.summary),
        f"**Rule.** {_escape(rule)}",
        f"**Heat.** {heat}",
        f"**Source.** {_escape(cls.source)}",
    ]
    if cls.params:
        parts.append(params_table(cls.params))
    else:
        parts.append("_No parameters beyond the common ones._")
    return "\n\n".join(parts)


def kv_format_card(name: str) -> str:
    """Markdown for one KV format: what it is, its rule, bits per value (head_dim 128, a bf16
    model, a quantized KIVI token), source."""
    spec = FORMATS[name]
    bits = KVQuant(name).bits_per_value(128, 2)
    return "\n\n".join(
        [
            f"### `{name}`",
            _escape(spec.summary),
            f"**Rule.** {_escape(spec.rule)}",
            f"**Bits per value.** {bits:.3g} (of 16)",
            f"**Source.** {_escape(spec.source)}",
        ]
    )


def kv_formats_markdown() -> str:
    """The KV formats section: how a format composes with eviction, then one card each."""
    intro = (
        "## How the KV cache can be stored\n\n"
        "Eviction keeps fewer tokens; quantization keeps every token in fewer bits. Any policy runs "
        "in any format: the cache holds the codes and scales, attention reads the decoded keys and "
        "values (the newest token reads itself exactly in the step that writes it), and eviction copies "
        "codes without quantizing them again. KV memory counts every stored byte (codes, scales, zero "
        "points, KIVI's full-precision residual); fidelity is always measured against the full cache at "
        "full precision."
    )
    return "\n\n".join([intro] + [kv_format_card(name) for name in FORMATS])


def learn_markdown() -> str:
    """Every registered policy's card, after the knobs they all share; then the KV formats."""
    intro = (
        "## How the policies decide\n\n"
        "Every policy keeps at most `budget` tokens per layer and kv-head (between compressions "
        "the cache grows to `budget + interval`), or, with `budget_mode` *fraction*, "
        "`budget_fraction` of the tokens seen so far. Protected spans, attention sinks and the "
        "recent window are always kept; the rest compete on the policy's score.\n\n"
        "Most policies keep the same number of tokens in every layer and kv-head. `pyramidkv` gives "
        "lower layers more and upper layers less, `adakv` lets the heads of a layer share its budget "
        "by need: the same total, spread unevenly. Each layer's cache then has its own length, and "
        "a head that keeps fewer tokens than its layer's longest is padded. The padding is hidden "
        "from attention but is real memory: the memory chart shows the physical bytes (padding "
        "included) and the logical ones (tokens held), and Explore shows how many tokens each "
        "layer and head holds at every step.\n\n"
        "#### Knobs every policy shares\n\n" + params_table(COMMON_PARAMS)
    )
    return "\n\n---\n\n".join([intro] + [policy_card(n) for n in policy_names()] + [kv_formats_markdown()])
