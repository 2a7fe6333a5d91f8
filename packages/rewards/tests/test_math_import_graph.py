"""rlloom.rewards.math has no import cycle, local (in-function) imports included (issue 26: math <-> equivalence
<-> worker). Imports are read from the source with `ast`, so a cycle that Python happens to tolerate still fails."""

from __future__ import annotations

import ast
from pathlib import Path

import rlloom.rewards.math

PACKAGE = "rlloom.rewards.math"
ROOT = Path(rlloom.rewards.math.__file__).parent


def _module_name(path: Path) -> str:
    return PACKAGE if path.name == "__init__.py" else f"{PACKAGE}.{path.stem}"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Modules of this package that `path` imports anywhere (top level or inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in modules:
                found.add(node.module)  # `from pkg import x` runs pkg/__init__.py, which imports the rest
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
    return found


def _graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.glob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) - {_module_name(p)} for p in paths}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = 1, stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node], _ = 2, stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_math_package_has_no_import_cycle() -> None:
    graph = _graph()
    # the edge that used to close the cycle (worker -> the package) is gone; numeric gives the precision default
    assert graph[f"{PACKAGE}.worker"] == {f"{PACKAGE}.symbolic", f"{PACKAGE}.numeric"}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
