"""The house rules that code review alone kept forgetting: short functions and modules, and a
CONTRIBUTING.md whose every path and name is real.  Read from the source with :mod:`ast`."""

from __future__ import annotations

import ast
import builtins
import re
import tomllib
from pathlib import Path

import pytest

from thinkviz.parser_lock import PARSER_LOCK

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "thinkviz").rglob("*.py"))
MAX_FUNCTION_LINES = 120  # a function you can see on one screen; nested functions count in their parent
MAX_MODULE_LINES = 600


def _functions(tree: ast.AST):
    """Outermost functions and methods (a nested function is part of the one that holds it)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node)


def _too_long(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    found = [f"{path.name}: {text.count(chr(10))} lines"] if text.count("\n") > MAX_MODULE_LINES else []
    with PARSER_LOCK:  # a Lessons warm-up from an earlier test may be reading recordings (gh-106905)
        tree = ast.parse(text)
    for node in _functions(tree):
        length = node.end_lineno - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
            found.append(f"{path.name}:{node.lineno} {node.name}: {length} lines")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_functions_and_modules_fit_on_screens(path):
    assert _too_long(path) == []


def test_the_length_check_counts_nested_functions(tmp_path):
    inner = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    source = tmp_path / "long.py"
    source.write_text(f"def outer():\n    def inner():\n{inner}\n    return inner\n", encoding="utf-8")
    assert _too_long(source) == [f"long.py:1 outer: {MAX_FUNCTION_LINES + 3} lines"]


# --- CONTRIBUTING.md names only what exists -------------------------------------------------

_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(\(\))?")
_LIBRARIES = ("gr.", "torch.", "np.")  # names of the libraries ThinkViz uses are theirs to keep


def _defined_names() -> set[str]:
    """Every module, class, function, attribute, field and keyword argument name in the package."""
    names = set(dir(builtins)) | {"thinkviz"}
    for path in SOURCES + sorted((ROOT / "tests").rglob("*.py")):
        names.add(path.stem)
        with PARSER_LOCK:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    names |= {marker.split(":")[0] for marker in config["tool"]["pytest"]["ini_options"]["markers"]}
    return names


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M))


def _problems(markdown: str) -> list[str]:
    names, targets, problems = _defined_names(), _make_targets(), []
    prose = re.sub(r"```.*?```", "", markdown, flags=re.S)  # code blocks are examples, not claims
    for span in _SPAN.findall(prose):
        if span.startswith("make "):
            problems += [f"make target {t!r}" for t in span.split()[1:] if t not in targets]
        elif " " in span or "<" in span or "…" in span:
            continue  # a command line or a pattern
        elif "/" in span or span.endswith((".py", ".md", ".toml")):
            path = span.rstrip("/")
            if not (ROOT / path).exists() and not list(ROOT.glob(f"thinkviz/**/{path}")):
                problems.append(f"path {span!r}")
        elif _IDENTIFIER.fullmatch(span) and not span.startswith(_LIBRARIES):
            parts = span.removesuffix("()").split(".")
            problems += [f"name {span!r}" for part in parts if part not in names][:1]
    return problems


def test_contributing_names_only_real_paths_and_identifiers():
    assert _problems((ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")) == []


def test_the_names_check_finds_what_is_not_there():
    text = "`thinkviz/nowhere.py`, `Policy.needs_hidden`, `make nothing`, `Policy.score`, `thinkviz/core/`"
    assert _problems(text) == ["path 'thinkviz/nowhere.py'", "name 'Policy.needs_hidden'", "make target 'nothing'"]
