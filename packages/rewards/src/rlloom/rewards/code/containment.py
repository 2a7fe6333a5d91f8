"""The sandbox's launch primitives: the isolation modes, the command that applies each, and the stdlib paths and
scientific packages the minimal root must show (`probe.py` finds which mode holds).

Two modes. `namespaces` (strong): util-linux `unshare` puts the program in fresh PID, mount, IPC, UTS and network
namespaces (no interface up, not even loopback); the harness makes the host tree read-only, chroots into a
minimal root (system dirs, /dev, /proc, the stdlib, a private size-capped tmpfs as its working directory) and
drops to a random unprivileged uid, so RLIMIT_NPROC binds and a fork bomb stops; when the
program ends the kernel kills everything left in its PID namespace. It needs root (as CI and the development
machines run) and nothing beyond util-linux. `rlimits` (weak): a plain child process with resource limits and,
as root, the uid drop; it has network access and can write to world-writable directories, so `execute` refuses
it unless the caller passes `allow_weak_isolation=True`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
from pathlib import Path
from typing import Literal

HARNESS = Path(__file__).with_name("sandboxed.py")
Mode = Literal["namespaces", "rlimits"]
# A network namespace of its own per run (no interface up, not even loopback): runs of one batch cannot reach each
# other (not even through abstract Unix sockets, which a shared namespace would let them share); about 1 ms a run.
UNSHARE_FLAGS = ("--pid", "--mount", "--ipc", "--uts", "--net", "--fork", "--kill-child", "--mount-proc")
SCIENTIFIC = (
    "numpy", "scipy", "pandas", "sympy", "mpmath", "networkx", "sortedcontainers", "dateutil", "pytz", "tzdata",
    "six",
)  # fmt: skip
"""Packages a solution may import (read-only) when the scoring interpreter has them: the scientific stack and the
few pure-Python packages it needs (pandas: dateutil, pytz, tzdata, six)."""
SITE = "/site"
_MENTIONS = re.compile(r"\b(numpy|scipy|pandas|sympy|mpmath|networkx|sortedcontainers|dateutil|pytz)\b")


def mentions_scientific(*sources: str) -> bool:
    """Whether any source names a SCIENTIFIC package: only then does a run mount them (about 7 ms of CPU a run
    otherwise spent on binds nobody reads). Honest code imports a package by its name."""
    return any(_MENTIONS.search(source) for source in sources)


class WeakIsolationError(RuntimeError):
    """Raised when only weak isolation is available and the caller did not opt in to it."""


class SandboxError(RuntimeError):
    """Raised when the sandbox itself failed (not the program inside it)."""


def launcher(mode: Mode, python: str) -> list[str]:
    """The argv prefix that starts the harness under `mode`; the caller appends CFG_FD RESULT_FD."""
    harness = [python, "-I", "-S", "-B", str(HARNESS)]
    # setpriv (util-linux) makes the run die with the scoring process, even when that is SIGKILLed
    setpriv = shutil.which("setpriv")
    dies_with_us = [setpriv, "--pdeathsig", "KILL"] if setpriv else []
    if mode == "namespaces":
        unshare = shutil.which("unshare") or "/usr/bin/unshare"
        return [*dies_with_us, unshare, *UNSHARE_FLAGS, *harness]
    return [*dies_with_us, *harness]


def stdlib_dirs() -> list[str]:
    """The interpreter's standard library directories, which the sandbox's minimal root must show."""
    stdlib = os.path.dirname(os.__file__)
    return [p for p in (stdlib, os.path.join(stdlib, "lib-dynload")) if os.path.isdir(p)]


def hidden_stdlib() -> list[tuple[str, list[str]]]:
    """Directories an unprivileged uid cannot traverse, each with the stdlib paths beneath it (weak mode)."""
    needed = stdlib_dirs()
    hidden: dict[str, list[str]] = {}
    for path in needed:
        parts = Path(path).parts
        for depth in range(2, len(parts) + 1):
            ancestor = str(Path(*parts[:depth]))
            if not os.stat(ancestor).st_mode & 0o001:
                hidden.setdefault(ancestor, []).append(path)
                break
    return [
        (d, [p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths)])
        for d, paths in hidden.items()
    ]


@functools.cache
def site_packages() -> tuple[tuple[str, str], ...]:
    """(host path, path in the sandbox) of each SCIENTIFIC package this interpreter can import, with the shared
    libraries its wheel bundles (`numpy.libs`), all under /site in the sandbox, so `$ORIGIN`-relative library
    paths still resolve. A package that is a namespace or lives in a zip is left out."""
    found: list[tuple[str, str]] = []
    for name in SCIENTIFIC:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not os.path.exists(spec.origin):
            continue
        path = os.path.dirname(spec.origin) if spec.submodule_search_locations else spec.origin
        found.append((path, f"{SITE}/{os.path.basename(path)}"))
        libs = os.path.join(os.path.dirname(path), f"{name}.libs")
        if os.path.isdir(libs):
            found.append((libs, f"{SITE}/{name}.libs"))
    return tuple(found)
