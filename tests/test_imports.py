"""The package's import graph: no cycles, and no imports tucked inside functions to hide one.

Read from the source with :mod:`ast` (nothing is imported): every ``import`` of a ``thinkviz``
module, at module level or inside a function, is an edge.  Importing ``a.b.c`` also runs the
``__init__`` of the packages ``a.b`` and ``a``, so those count as edges too, except the
packages the importing module sits in (they are initialising already).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from thinkviz.parser_lock import PARSER_LOCK

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "thinkviz"

# Imports inside a function, each with the reason it is there: (module, imported module).
DEFERRED = {
    ("thinkviz.bench.browser", "playwright.sync_api"),  # a dev requirement: the CLI runs without it
    # importing bitsandbytes logs a warning on stderr (its optional hub kernel is missing), which
    # would come before every CLI command's one-line error; only bench quant-kernels needs it
    ("thinkviz.bench.quant_kernels", "bitsandbytes"),
    ("thinkviz.bench.served", "gradio_client"),
    # gguf: the borrowed GPU machines lack it, and the CLI must import there (tests/test_gpu_check.py)
    ("thinkviz.models.gguf_file", "gguf"),  # with gradio: `bench gpu` runs on machines without either
    # plotly: the borrowed GPU machines lack it, and `bench gpu` runs there (tests/test_gpu_check.py)
    ("thinkviz.sweep.grid", "thinkviz.viz.pareto"),
    ("thinkviz.commands.bench.summary", "thinkviz.viz.pareto"),
    # Ray is optional (requirements-dev): only a sweep that asks for workers imports it
    ("thinkviz.sweep.runner", "thinkviz.sweep.ray_pool"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(name: str) -> list[tuple[str, bool]]:
    """``(imported module, inside a function)`` for every import in module ``name``."""
    with PARSER_LOCK:  # a Lessons warm-up from an earlier test may be reading recordings (gh-106905)
        tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    package = name if _is_package(name) else name.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                continue
            deeper = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                found.append((base, in_function))
                for alias in child.names:  # `from . import x` imports the submodule x
                    if f"{base}.{alias.name}" in MODULES:
                        found.append((f"{base}.{alias.name}", in_function))
            visit(child, deeper)

    visit(tree, False)
    return found


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for name in MODULES:
        own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        for target, _ in _imports(name):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                step = ".".join(parts[:i])
                if step in MODULES and step != name and step not in own_packages:
                    edges[name].add(step)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def test_the_import_graph_has_no_cycles():
    cycles = _cycles(_graph())
    assert cycles == [], f"import cycles: {[sorted(c) for c in cycles]}"


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_are_at_module_level(name):
    inside = {target for target, in_function in _imports(name) if in_function}
    assert inside <= {target for module, target in DEFERRED if module == name}, (
        f"{name} imports {sorted(inside)} inside a function; import at the top, or say why in DEFERRED"
    )


def test_no_tab_imports_another():
    tabs = {name for name in MODULES if name.startswith("thinkviz.ui.tabs.")}
    for name in tabs:
        assert not {target for target, _ in _imports(name)} & tabs, f"{name} imports another tab"


def test_no_gradio_outside_the_wiring():
    """Gradio is imported only by the Blocks modules (the app, its tabs, widgets, chat controls, the
    model panel, the room panel, handlers, field checks)."""
    wiring = {
        "thinkviz.ui.app",
        "thinkviz.ui.widgets",
        "thinkviz.ui.chat_controls",
        "thinkviz.ui.model_panel",
        "thinkviz.ui.room_panel",
        "thinkviz.ui.handlers",
        "thinkviz.ui.fields",
    }
    users = {name for name in MODULES if any(t.split(".")[0] == "gradio" for t, _ in _imports(name))}
    assert {name for name in users - wiring if not name.startswith("thinkviz.ui.tabs")} == set()
    assert "thinkviz.ui.tabs.live" in users  # the check sees the imports it is about


# The layers, lowest first: a module imports only from its own layer or the layers below it.
LAYERS = (
    # no thinkviz imports
    ("thinkviz.units", "thinkviz.cores", "thinkviz.predictor", "thinkviz.text", "thinkviz.parser_lock"),
    ("thinkviz.policies",),  # rules: scores over a cache view
    ("thinkviz.core", "thinkviz.models", "thinkviz.memory"),  # the engine, the model it runs, its bytes
    ("thinkviz.measure", "thinkviz.demos"),  # replay, fidelity, presets and their recordings
    ("thinkviz.sweep", "thinkviz.viz", "thinkviz.export"),  # grids of runs; figures, tables, files
    ("thinkviz.ui", "thinkviz.commands", "thinkviz.bench"),  # the app, the CLI's commands, benchmarks
    ("thinkviz.cli", "thinkviz.__main__"),
)
# Within the top layer, who may not import whom: the app and the CLI share nothing but what is below.
APART = (("thinkviz.ui", "thinkviz.bench"), ("thinkviz.ui", "thinkviz.commands"), ("thinkviz.commands", "thinkviz.ui"))


def _top(name: str) -> str:
    """``thinkviz.core.engine`` → ``thinkviz.core``; a module directly in the package is its own."""
    return ".".join(name.split(".")[:2])


def _layer(name: str) -> int:
    for rank, members in enumerate(LAYERS):
        if _top(name) in members:
            return rank
    raise AssertionError(f"{name} is in no layer: add {_top(name)} to LAYERS")


def _upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} → {b}"
        for a, targets in edges.items()
        for b in targets
        if _layer(b) > _layer(a) or (_top(a), _top(b)) in APART
    )


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n != "thinkviz"))
def test_every_module_has_a_layer(name):
    _layer(name)


def test_imports_keep_the_layers():
    edges = {a: targets for a, targets in _graph().items() if a != "thinkviz"}
    assert _upward(edges) == [], "imports against the layers (see LAYERS)"


def test_the_layer_checker_finds_an_upward_import():
    edges = {"thinkviz.core.engine": {"thinkviz.ui.app"}, "thinkviz.ui.app": {"thinkviz.bench.load"}}
    assert _upward(edges) == ["thinkviz.core.engine → thinkviz.ui.app", "thinkviz.ui.app → thinkviz.bench.load"]


def test_no_module_name_twice_in_a_subpackage():
    """Inside each sub-package tree (``thinkviz/ui/**``, ``thinkviz/core/**`` …) a module's name says
    which one it is: no two share a name (``ui/live.py`` beside ``ui/tabs/live.py`` was such a pair)."""
    trees: dict[str, dict[str, list[str]]] = {}
    for name, path in MODULES.items():
        parts = name.split(".")
        if len(parts) > 2 and path.name != "__init__.py":
            trees.setdefault(parts[1], {}).setdefault(parts[-1], []).append(name)
    twins = {tree: {k: v for k, v in names.items() if len(v) > 1} for tree, names in trees.items()}
    assert {tree: names for tree, names in twins.items() if names} == {}


def test_the_package_top_level_is_short():
    loose = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__", "cli"}
    assert len(loose) <= 10, sorted(loose)
