"""The wings stay findable (issue 38): no folder of core_rl or rollout holds more than 15 modules side by side, no
source file passes 600 lines (trainer.py 400), apps import core_rl and rollout only through a facade (a package's
or a wing's `__init__`), and every facade's lazy table names exactly what it declares to type checkers and resolves.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WINGED = [ROOT / "packages/core-rl/src/rlloom/core_rl", ROOT / "packages/rollout/src/rlloom/rollout"]
SOURCES = sorted(p for p in ROOT.glob("packages/*/src/rlloom/**/*.py")) + sorted(ROOT.glob("apps/*/src/**/*.py"))
MAX_SIDE_BY_SIDE = 15
MAX_LINES = 600
TRAINER_MAX_LINES = 400


def folders(root: Path) -> list[Path]:
    return [root, *sorted(p for p in root.rglob("*") if p.is_dir() and (p / "__init__.py").exists())]


@pytest.mark.parametrize("folder", [f for root in WINGED for f in folders(root)], ids=lambda p: p.name)
def test_no_folder_holds_more_than_15_modules(folder: Path) -> None:
    modules = [p.name for p in folder.glob("*.py") if p.name not in ("__init__.py", "__about__.py")]
    assert len(modules) <= MAX_SIDE_BY_SIDE, f"{folder}: {len(modules)} modules side by side: {sorted(modules)}"


def test_no_source_file_is_over_600_lines_and_the_loop_stays_short() -> None:
    long = {str(p.relative_to(ROOT)): n for p in SOURCES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
    trainer = WINGED[0] / "trainer.py"
    assert len(trainer.read_text().splitlines()) <= TRAINER_MAX_LINES


def facades() -> list[str]:
    """Every package `__init__` of core_rl and rollout with a lazy `_EXPORTS` table."""
    found = []
    for root in WINGED:
        for init in root.rglob("__init__.py"):
            if "_EXPORTS = {" in init.read_text():
                rel = init.parent.relative_to(root.parent.parent)
                found.append(".".join(rel.parts))
    return sorted(found)


def declared_for_type_checkers(module_file: Path) -> set[str]:
    tree = ast.parse(module_file.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.ImportFrom):
                    names |= {a.asname or a.name for a in stmt.names}
    return names


@pytest.mark.parametrize("package", facades())
def test_each_facade_exports_what_it_declares_and_every_name_resolves(package: str) -> None:
    module = importlib.import_module(package)
    exports = module._EXPORTS
    assert set(exports) == declared_for_type_checkers(Path(module.__file__))
    for name in exports:
        assert getattr(module, name) is getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


def test_the_facades_were_found() -> None:
    assert {"rlloom.core_rl.config", "rlloom.core_rl.contracts", "rlloom.rollout"} <= set(facades())


def is_facade(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


def test_apps_import_core_rl_and_rollout_only_through_facades() -> None:
    inner = []
    for path in sorted(ROOT.glob("apps/*/src/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            if node.module.startswith(("rlloom.core_rl", "rlloom.rollout")) and not is_facade(node.module):
                inner.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}")
    assert inner == []
