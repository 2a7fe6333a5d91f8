"""Start gloo ranks with `torch.multiprocessing.spawn` on a function of a test file.

Spawned children find the function by importing its module, and pytest's importlib mode names test modules after
their path from the repository root, which a child cannot import (nor can it from the installed-wheel session's
temp folder). This module is importable in the children (spawn copies the parent's sys.path, which has tests/), and
it loads the test file by its path there.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp


def _run_in_file(rank: int, path: str, name: str, args: tuple[Any, ...]) -> None:
    spec = importlib.util.spec_from_file_location(f"rank_program_{Path(path).stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    getattr(module, name)(rank, *args)


def spawn_ranks(path: str, name: str, args: tuple[Any, ...], nprocs: int) -> None:
    """`mp.spawn(function name in file path, args, nprocs)`: the function gets (rank, *args)."""
    mp.spawn(_run_in_file, args=(path, name, args), nprocs=nprocs)
