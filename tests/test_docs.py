"""The documentation says only what runs: every command in README.md and docs/*.md parses, every
relative link and image resolves, docs/cli.md and the README's KV-format table are what the code
generates, and docs/api.md names every endpoint and parameter of the app.

A command is a line (or inline code span) that starts with ``python -m thinkviz``, ``thinkviz``,
``python app.py`` or ``make``, after any ``VAR=value`` prefix.  It is parsed as argparse would parse it
(``--help``-level: no model, no run).  A command with an elision (``…``) is checked part by part: its
sub-command path exists and each of its ``--options`` belongs to that sub-command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

import app
from scripts import docs_gen
from thinkviz.cli import build_parser
from thinkviz.ui.app import build_app
from thinkviz.ui.model_slot import ModelSlot
from tiny_models import tiny_model

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HTML_TARGET = re.compile(r"<(?:img|a)\s[^>]*(?:src|href)=\"([^\"]+)\"")
ANCHOR = re.compile(r"<a id=\"([^\"]+)\"")
ENV = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+")
PREFIXES = ("python -m thinkviz ", "thinkviz ", "python app.py", "make ")
ELISION = ("…", "...")


def commands(text: str) -> list[str]:
    """The commands of one page: code-block lines (``\\``-continued, comments and ``nice``/``.venv/bin/``
    dropped) and inline code spans outside headings."""
    found = []
    for block in FENCE.findall(text):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines()[1:-1]:
            found.append(line.split(" # ")[0].split("  #")[0].strip())
    found += INLINE.findall(re.sub(r"^#.*$", "", FENCE.sub("", text), flags=re.M))  # a heading may name a command group
    out = []
    for line in found:
        line = ENV.sub("", line.strip())
        line = re.sub(r"^(?:nice -n \d+ )?(?:\.venv/bin/)?", "", line)
        if line.startswith(PREFIXES) and not line.startswith("make sure"):
            out.append(line)
    return out


def all_commands() -> list[tuple[str, str]]:
    return [(page.name, line) for page in PAGES for line in commands(page.read_text(encoding="utf-8"))]


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8").replace("$(VENV)", ".venv")
    return {target for line in re.findall(r"^([^\s#=:][^:=]*):(?!=)", text, re.M) for target in line.split()}


def parse_quietly(parse, args: list[str]) -> str:
    """'' when ``parse(args)`` accepts ``args`` (``--help`` included), else argparse's message."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parse(args)
        except SystemExit as exc:
            return "" if exc.code == 0 else err.getvalue().strip().splitlines()[-1]
    return ""


def elided_problem(parser: argparse.ArgumentParser, args: list[str]) -> str:
    """For a command with ``…`` in it: '' when its sub-commands exist and its options belong to the last one."""
    for word in (a for a in args if not a.startswith("-") and a not in ELISION):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            break
        if word not in subs[0].choices:
            return f"no sub-command {word!r}"
        parser = subs[0].choices[word]
    unknown = [a for a in args if a.startswith("--") and a.split("=")[0] not in parser._option_string_actions]
    return f"unknown options {unknown}" if unknown else ""


def problem(line: str) -> str:
    words = shlex.split(line)
    if words[0] == "make":
        missing = [w for w in words[1:] if "=" not in w and w not in makefile_targets()]
        return f"no make target {missing}" if missing else ""
    args = words[2:] if words[0] == "python" else words[1:]  # python app.py … / python -m thinkviz … / thinkviz …
    args = args[1:] if words[:2] == ["python", "-m"] else args
    parse = app.parse_args if words[:2] == ["python", "app.py"] else build_parser().parse_args
    if any(e in word for word in args for e in ELISION):
        return "" if parse is app.parse_args else elided_problem(build_parser(), args)
    return parse_quietly(parse, args)


def test_the_pages_hold_commands_to_check():
    found = all_commands()
    assert len(found) > 40
    assert ("README.md", "make run") in found and ("README.md", "make test") in found


@pytest.mark.parametrize(("page", "line"), all_commands())
def test_every_command_in_the_docs_parses(page, line):
    assert problem(line) == "", f"{page}: {line}"


def test_a_broken_command_is_noticed():
    assert problem("python -m thinkviz generate --budgte 8 'x'")
    assert problem("python -m thinkviz bench sweep … --no-such-flag")
    assert problem("python -m thinkviz bench nope …")
    assert problem("make no-such-target")
    assert problem("python app.py --port 0")
    assert not problem("make gpu-check GPU_OUT=out")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    out = set(ANCHOR.findall(text))
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", text), re.M):
        base = slug(heading)
        out.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return out


def links(page: Path) -> list[str]:
    text = INLINE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    return LINK.findall(text) + HTML_TARGET.findall(text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_image_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def test_docs_cli_md_and_the_readme_kv_table_are_what_the_code_generates():
    assert docs_gen.stale() == []


def test_docs_api_md_names_every_endpoint_and_parameter_of_the_app():
    """docs/api.md has a section per endpoint of the app (built here around a tiny model) naming each parameter."""
    tiny = tiny_model("llama")
    slot = ModelSlot(loader=lambda name, quantization, device, progress=None: tiny)
    slot.start("tiny", "none")
    endpoints = build_app(slot, model="tiny", quantization="none").get_api_info()["named_endpoints"]
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## `(/\w+)`\n(.*?)(?=^## |\Z)", page, re.S | re.M))
    assert set(sections) == set(endpoints)
    missing = {
        name: [p["parameter_name"] for p in info["parameters"] if f"`{p['parameter_name']}`" not in sections[name]]
        for name, info in endpoints.items()
    }
    assert {name: params for name, params in missing.items() if params} == {}


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 300
