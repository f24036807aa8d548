"""The arrows between ``reclock``'s modules point one way (STYLE.md): no import cycles, and only the ``dev``/
``demo`` commands reach the dev stack. Read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "include" / "reclock"

KNOWN_CYCLES: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _targets(name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The ``reclock`` modules an import statement in module ``name`` runs (a module's parents too)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = name.split(".") if (MODULES[name].name == "__init__.py") else name.split(".")[:-1]
            base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    out = []
    for full in names:
        parts = full.split(".")
        out += [".".join(parts[:i]) for i in range(2, len(parts) + 1) if ".".join(parts[:i]) in MODULES]
    return [t for t in out if t != name]


def _imports(name: str, module_level_only: bool) -> set[str]:
    tree = ast.parse(MODULES[name].read_text())
    found: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and not (module_level_only and inner):
                found.update(_targets(name, child))
            visit(child, inner)

    visit(tree, False)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_the_walk_sees_the_package():
    assert {"reclock.cycle", "reclock.settings", "reclock.persist.compact"} <= set(MODULES)
    assert "reclock.persist.compact" in _imports("reclock.cycle", module_level_only=True)
    assert "reclock.dev.demo" in _imports("reclock.cli", module_level_only=False)  # a function-level import
    assert "reclock.dev.demo" not in _imports("reclock.cli", module_level_only=True)
    assert {"reclock.persist", "reclock.persist.remap_store"} <= _imports("reclock.cycle", True)  # parents run too


def test_no_import_cycle_at_module_level():
    graph = {name: _imports(name, module_level_only=True) for name in MODULES}
    assert _cycles(graph) == []


def test_no_import_cycle_hidden_in_a_function():
    graph = {name: _imports(name, module_level_only=False) for name in MODULES}
    assert set(_cycles(graph)) <= KNOWN_CYCLES


def test_only_the_dev_commands_reach_the_dev_stack():
    reaching = {name for name in MODULES if not name.startswith("reclock.dev")
                and any(t.startswith("reclock.dev") for t in _imports(name, module_level_only=False))}
    assert reaching == {"reclock.cli"}
    cli = ast.parse(MODULES["reclock.cli"].read_text())
    for fn in (n for n in ast.walk(cli) if isinstance(n, ast.FunctionDef)):
        imports_dev = any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("reclock.dev")
                          for n in ast.walk(fn))
        assert not imports_dev or fn.name in {"_stack", "install", "up", "demo"}, fn.name


# -- the layering (STYLE.md, issue 31): arrows point from adapters to the core, from wiring to the library --

PURE_CORE = ("reclock.time", "reclock.remap", "reclock.batch", "reclock.compaction", "reclock.bitexact")
READERS = ("reclock.tables", "reclock.read")
SOURCES = PACKAGE / "sources"
KINDS = sorted(p.name for p in SOURCES.iterdir() if (p / "__init__.py").is_file())
"""The source kinds' folders under ``reclock/sources/`` (a kind under way may have no ``kind.py`` yet)."""


@functools.cache
def _graph() -> dict[str, set[str]]:
    return {n: _imports(n, module_level_only=False) for n in MODULES}


def _reaches(name: str) -> set[str]:
    """Every ``reclock`` module ``name`` imports, directly or through others, at any level."""
    graph = _graph()
    seen: set[str] = set()
    todo = [name]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _under(modules: set[str], *packages: str) -> set[str]:
    return {m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)}


def test_the_pure_core_imports_only_itself():
    for name in PURE_CORE:
        assert _reaches(name) <= set(PURE_CORE), (name, sorted(_reaches(name) - set(PURE_CORE)))


def test_persist_imports_no_source():
    for name in _under(set(MODULES), "reclock.persist"):
        assert not _under(_reaches(name), "reclock.sources"), name


def test_readers_import_no_orchestration():
    for name in READERS:
        assert not _under(_reaches(name), "reclock.orchestration", "reclock.cycle", "reclock.sources"), name


def test_every_kind_with_a_kind_object_is_registered():
    """A kind is its folder and its line in the registry: the folders with a ``kind.py`` are the registry's."""
    from reclock.sources.registry import KINDS as REGISTERED

    assert sorted(REGISTERED) == [k for k in KINDS if (SOURCES / k / "kind.py").is_file()]
    assert {"kafka", "postgres"} <= set(REGISTERED)


def test_a_kind_imports_no_other_kind_nor_the_cycle_nor_the_wiring():
    for kind in KINDS:
        others = [f"reclock.sources.{k}" for k in KINDS if k != kind]
        for name in _under(set(MODULES), f"reclock.sources.{kind}"):
            reached = _reaches(name)
            assert not _under(reached, *others), (name, sorted(_under(reached, *others)))
            assert not _under(reached, "reclock.cycle", "reclock.orchestration", "reclock.dev",
                              "reclock.sources.registry"), name


def test_the_cycle_names_no_kind():
    """``cycle.py`` reaches every kind through ``reclock.sources.base`` and the registry: it imports no kind's
    module and its text names none (a branch on ``spec.postgres`` would)."""
    direct = _imports("reclock.cycle", module_level_only=False)
    assert not _under(direct, *(f"reclock.sources.{k}" for k in KINDS)), sorted(direct)
    text = MODULES["reclock.cycle"].read_text().lower()
    assert [k for k in KINDS if k in text] == []
