"""``python -m thinkviz policies``: every registered policy with its knobs, ranges and choices.

The listing is read from the registry, so a new policy appears here by itself; ``--markdown``
prints the README's policy table (a test checks that the README holds exactly that table).
"""

from __future__ import annotations

import argparse
import re

from .common import CliError, command
from ..policies import POLICIES, Param, policy_class
from ..policies.base import COMMON_PARAMS

COMMON_FLAGS = {
    "budget": "--budget N",
    "budget_mode": "--budget-mode",
    "budget_fraction": "--budget-fraction F",
    "interval": "--interval N",
    "protect_system": "--no-protect-system",
    "protect_question": "--no-protect-question",
}  # how generate takes the shared knobs


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="POLICY", help="only these policies (default: all)")
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the README's policy table (policy, rule, source, own knobs) instead",
    )


def _cell(text: str) -> str:
    """A Markdown table cell: one line, pipes escaped, tags such as ``<think>`` shown as code."""
    return re.sub(r"(</?\w+>)", r"`\1`", " ".join(text.split()).replace("|", "\\|"))


def markdown_table(names: list[str]) -> str:
    """One row per policy: name, its rule in plain words, its source, its own knobs."""
    rows = ["| policy | rule | source | own knobs |", "|---|---|---|---|"]
    for name in names:
        cls = policy_class(name)
        knobs = ", ".join(f"`{p.name}`" for p in cls.params) or "—"
        rows.append(f"| `{name}` | {_cell(cls.summary)} | {_cell(cls.source)} | {knobs} |")
    return "\n".join(rows) + "\n"


def _knob_line(flag: str, param: Param) -> str:
    return f"  {flag:<28} {param.range_text:<16} {param.help}"


def listing(names: list[str]) -> str:
    """The knobs every policy shares, then each policy's rule, source and own knobs."""
    lines = ["Every policy takes:"]
    lines += [
        _knob_line(COMMON_FLAGS[p.name] if p.kind == "bool" else f"{COMMON_FLAGS[p.name]} ({p.default})", p)
        for p in COMMON_PARAMS
    ]
    for name in names:
        cls = policy_class(name)
        lines += ["", f"{name}: {' '.join(cls.summary.split())}", f"  source: {cls.source}"]
        lines += [_knob_line(f"--param {p.name}={p.default}", p) for p in cls.params] or [
            "  (no knobs beyond the shared ones)"
        ]
    return "\n".join(lines) + "\n"


@command("policies", configure)
def run(args: argparse.Namespace) -> int:
    """List the policies with their knobs: defaults, ranges, choices (--markdown: the README table)."""
    unknown = [name for name in args.names if name not in POLICIES]
    if unknown:
        raise CliError(f"unknown policy {', '.join(map(repr, unknown))}; choose from: {', '.join(POLICIES)}")
    names = args.names or list(POLICIES)
    print(markdown_table(names) if args.markdown else listing(names), end="")
    return 0
