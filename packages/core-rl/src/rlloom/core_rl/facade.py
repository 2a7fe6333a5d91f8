"""Lazy facades: a wing's `__init__` names what callers use, and imports its module on first use.

`from rlloom.core_rl.config import RLConfig` must stay light (a config typo is reported before torch loads), so a
facade cannot import all its wing's modules up front. Each `__init__` keeps an `_EXPORTS` table (name -> module of
the wing) for this function, and the same names under `TYPE_CHECKING` for type checkers.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def lazy_attribute(package: str, exports: Mapping[str, str], name: str) -> Any:
    """`package.name`, imported from the wing module `exports[name]`; an AttributeError for any other name (so
    `from package import submodule` still imports the submodule, as Python does for a missing attribute)."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{package}.{module}"), name)
