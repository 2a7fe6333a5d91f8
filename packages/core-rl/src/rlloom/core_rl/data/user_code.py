"""Loading a user's own object named by an import spec: `"package.module:Name"` or `"path/to/file.py:Name"`.

The same spelling as veRL's custom reward function and rlloom-rewards' custom scorers; the name follows the LAST
colon, so a Windows drive letter (`C:/x.py:Name`) still works. A file is imported once per process (by its
resolved path) under a private module name; a relative file path is taken from the working directory.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any


class UserCodeError(ValueError):
    """The spec is malformed, or its module, file or name cannot be loaded; the message says how to fix it."""


def split_spec(spec: str) -> tuple[str, str]:
    """`("package.module" or "path/file.py", "Name")`; a `UserCodeError` unless the spec has both parts."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target.strip() or not name.strip():
        raise UserCodeError(f"{spec!r} is not 'package.module:Name' or 'path/to/file.py:Name'")
    return target.strip(), name.strip()


def is_file_target(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def load_object(spec: str) -> Any:
    """The object `spec` names (see the module docstring); errors say what was missing and what is there."""
    target, name = split_spec(spec)
    module = _load_file(Path(target)) if is_file_target(target) else _import(target, spec)
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_"))[:20]
        raise UserCodeError(f"{target!r} has no {name!r}; the public names there: {', '.join(public) or 'none'}")
    return getattr(module, name)


def _import(target: str, spec: str) -> Any:
    try:
        return importlib.import_module(target)
    except ImportError as err:
        raise UserCodeError(
            f"cannot import module {target!r} for {spec!r} ({err}); install the package that provides it, put it on "
            "PYTHONPATH, or name a file instead ('path/to/file.py:Name')"
        ) from err


def _load_file(path: Path) -> Any:
    if not path.is_file():
        raise UserCodeError(f"file {str(path)!r} does not exist (relative paths start at {Path.cwd()})")
    resolved = str(path.resolve())
    name = f"rlloom_user_{path.stem}_{hashlib.sha1(resolved.encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        raise UserCodeError(f"importing {str(path)!r} failed: {type(err).__name__}: {err}") from err
    return module
