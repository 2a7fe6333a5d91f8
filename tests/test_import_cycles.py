"""No import cycle inside any package or app, counting imports inside functions too.

A cycle (a imports b imports a) works only while every import in it happens to run in a lucky order, and it
hides which module is the lower layer. Imports are read from the source with `ast`, so a deferred import inside a
function counts: deferring one is how cycles are usually hidden. A package's `__init__` re-exporting its
submodules is fine; a submodule importing names back through its own package's `__init__` closes a cycle.
Imports under `if TYPE_CHECKING:` never run and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.glob("packages/*/src/rlloom/*"), *ROOT.glob("apps/*/src/rlloom_apps/*")])


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of the same package that `path` (module `name`) imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    type_only = {
        id(inner)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import name` runs the package's __init__, and imports the submodule when `name` is one
            targets = [base, *(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules)]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a module we know, or its nearest package
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles_in(source: Path) -> list[list[str]]:
    src = source.parent.parent if source.parent.name in ("rlloom", "rlloom_apps") else source.parent
    files = {module_name(p, src): p for p in source.rglob("*.py")}
    graph = {name: imports_of(path, name, set(files)) for name, path in files.items()}
    return strongly_connected(graph)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: every group of two or more modules that import each other, directly or not."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_checker_finds_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    package = tmp_path / "src" / "rlloom" / "demo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from rlloom.demo.a import f\n")
    (package / "a.py").write_text("from rlloom.demo.b import g\n\ndef f():\n    return g()\n")
    (package / "b.py").write_text("def g():\n    from rlloom.demo import a\n    return a\n")
    (package / "c.py").write_text("from rlloom.demo import a\n")  # imports a, nobody imports c: no cycle
    assert cycles_in(package) == [["rlloom.demo", "rlloom.demo.a", "rlloom.demo.b"]]  # b reaches a via __init__


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_no_import_cycle(source: Path) -> None:
    assert cycles_in(source) == []


def test_the_checker_finds_a_cycle_through_a_package_init(tmp_path: Path) -> None:
    """rewards.math had this one: a submodule importing a sibling through its package, whose __init__ imports the
    submodule's importer."""
    package = tmp_path / "src" / "rlloom" / "demo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from rlloom.demo.equivalence import compare\n")
    (package / "equivalence.py").write_text("from rlloom.demo.worker import run\n")
    (package / "worker.py").write_text("from rlloom.demo import symbolic\n")
    (package / "symbolic.py").write_text("X = 1\n")
    (package / "typing_only.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import rlloom.demo\n"
    )
    assert cycles_in(package) == [["rlloom.demo", "rlloom.demo.equivalence", "rlloom.demo.worker"]]
