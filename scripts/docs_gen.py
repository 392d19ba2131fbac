"""The generated parts of the docs: docs/cli.md from the argument parsers (every command, sub-command and
option of ``python -m thinkviz``) and the README's KV-format table from :data:`thinkviz.core.kvquant.FORMATS`.

    .venv/bin/python scripts/docs_gen.py               # rewrite docs/cli.md
    .venv/bin/python scripts/docs_gen.py --kv-formats  # print the README's KV-format table
    .venv/bin/python scripts/docs_gen.py --check       # exit 1 when docs/cli.md or the README table is stale

(tests/test_docs.py runs the same checks; the policy table is ``python -m thinkviz policies --markdown``.)

Walks :func:`thinkviz.cli.build_parser` (argparse's own actions, not its terminal-width help text), commands
in alphabetical order, so the page is the same on every machine and whichever module registers a command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, not an installed copy
from thinkviz.cli import build_parser  # noqa: E402
from thinkviz.core.kvquant import FORMATS, KVQuant  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLI_MD = ROOT / "docs" / "cli.md"
README = ROOT / "README.md"
PROG = "python -m thinkviz"
HEAD = f"""# Command line

Every command and option of `{PROG}` (or `thinkviz`, the console script), generated from the
argument parsers by `python scripts/docs_gen.py`; `tests/test_docs.py` fails when this page is stale.
Do not edit it by hand. Every user error prints one line, `thinkviz: error: <reason>`, and exits
with code 2; a run that fails mid-way exits with code 1. The app itself takes its own options:
`python app.py --help`.
"""


def cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def option_name(action: argparse.Action) -> str:
    """``--budget N`` / ``--json OUT`` / ``trace``: the option strings with the value they take."""
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    if action.nargs == 0:
        return ", ".join(f"`{s}`" for s in action.option_strings)
    choices = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else ""
    value = action.metavar or choices or action.dest.upper()
    return ", ".join(f"`{s} {value}`" for s in action.option_strings)


def default_of(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or not action.option_strings:
        return ""
    value = ",".join(map(str, action.default)) if isinstance(action.default, list | tuple) else action.default
    return f"`{value}`"


def options_table(parser: argparse.ArgumentParser) -> list[str]:
    """One row per argument of ``parser``: name (with its value), default, help (``%(default)s`` expanded)."""
    formatter = parser._get_formatter()
    rows = ["| option | default | what it does |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        help_text = formatter._expand_help(action) if action.help else ""
        if action.choices and action.option_strings and action.metavar:
            help_text += f" (one of: {', '.join(map(str, action.choices))})"
        rows.append(f"| {option_name(action)} | {default_of(action)} | {cell(help_text)} |")
    return rows if len(rows) > 2 else []


def sections(parser: argparse.ArgumentParser, words: list[str], summary: str, depth: int) -> list[str]:
    """The section of the command ``words`` and, below it, one for each of its sub-commands."""
    lines = [f"{'#' * depth} `{' '.join([PROG, *words])}`", ""]
    if summary:
        lines += [cell(summary), ""]
    table = options_table(parser)
    lines += [*table, ""] if table else []
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for sub in subs:
        helps = {choice.dest: choice.help or "" for choice in sub._choices_actions}
        for name, child in sorted(sub.choices.items()):
            lines += sections(child, [*words, name], helps.get(name, ""), min(depth + 1, 4))
    return lines


def render_cli() -> str:
    parser = build_parser()
    parser.prog = PROG
    body = []
    for sub in (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)):
        helps = {choice.dest: choice.help or "" for choice in sub._choices_actions}
        index = [f"- [`{name}`](#{anchor(name)}) — {cell(helps.get(name, ''))}" for name in sorted(sub.choices)]
        body += ["## Commands", "", *index, ""]
        for name, child in sorted(sub.choices.items()):
            body += sections(child, [name], helps.get(name, ""), 2)
    return HEAD + "\n" + "\n".join(body).rstrip() + "\n"


def anchor(name: str) -> str:
    """GitHub's anchor of the heading ``python -m thinkviz NAME`` (in backticks)."""
    return f"python--m-thinkviz-{name}"


def kv_formats_table() -> str:
    """The README's table of KV-cache formats: rule, stored bits per value and the fraction of a bf16 and of a
    float32 cache each keeps (head_dim 128; KIVI at its default residual of 32 tokens)."""
    full = FORMATS["none"]
    rows = [
        "| format | what is stored | bits per value (bf16 model) | of a bf16 cache | of a float32 cache | source |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name, spec in FORMATS.items():
        quant = KVQuant(name)
        bf16, fp32 = (quant.slot_bytes(1, 128, n) / full.slot_bytes(1, 128, n) for n in (2, 4))
        bits = quant.bits_per_value(128)
        rows.append(f"| `{name}` | {cell(spec.summary)} | {bits:.4g} | {bf16:.1%} | {fp32:.1%} | {cell(spec.source)} |")
    return "\n".join(rows).replace("%", " %") + "\n"


def stale() -> list[str]:
    """The generated parts that differ from what is committed."""
    problems = []
    if CLI_MD.read_text(encoding="utf-8") != render_cli():
        problems.append(f"{CLI_MD} is stale: run python scripts/docs_gen.py")
    if kv_formats_table() not in README.read_text(encoding="utf-8"):
        problems.append("README's KV-format table is stale: paste python scripts/docs_gen.py --kv-formats")
    return problems


def main(argv: list[str]) -> int:
    if "--kv-formats" in argv:
        print(kv_formats_table(), end="")
    elif "--check" in argv:
        for problem in stale():
            print(problem, file=sys.stderr)
        return 1 if stale() else 0
    else:
        CLI_MD.write_text(render_cli(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
