"""The sandbox's launch primitives: the isolation modes, the command that applies each, the empty network
namespace every run joins, and the stdlib paths the minimal root must show (`probe.py` finds which mode holds).

Two modes. `namespaces` (strong): util-linux `unshare` puts the program in fresh PID, mount, IPC and UTS
namespaces; the harness joins an empty network namespace, makes the host tree read-only, chroots into a
minimal root (system dirs, /dev, /proc, the stdlib, a private size-capped tmpfs as its working directory) and
drops to a random unprivileged uid, so RLIMIT_NPROC binds and a fork bomb stops; when the
program ends the kernel kills everything left in its PID namespace. It needs root (as CI and the development
machines run) and nothing beyond util-linux. `rlimits` (weak): a plain child process with resource limits and,
as root, the uid drop; it has network access and can write to world-writable directories, so `execute` refuses
it unless the caller passes `allow_weak_isolation=True`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Literal

HARNESS = Path(__file__).with_name("sandboxed.py")
Mode = Literal["namespaces", "rlimits"]
# No --net: creating a network namespace per run costs 10-25 ms, so every run joins one empty namespace instead.
UNSHARE_FLAGS = ("--pid", "--mount", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc")


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


_netns_lock = threading.Lock()
_netns: dict[str, int] = {}


def empty_netns() -> int:
    """An fd to a network namespace with no interface up (not even loopback), made once and shared by all runs.

    A short-lived `unshare --net sleep` creates it; the fd keeps it alive after that process is gone. Runs that
    overlap in time share it, so they could reach each other through abstract Unix sockets, but never the host,
    the loopback or the outside world.
    """
    with _netns_lock:
        if "fd" in _netns:
            return _netns["fd"]
        unshare = shutil.which("unshare") or "/usr/bin/unshare"
        own = os.readlink("/proc/self/ns/net")
        holder = subprocess.Popen([unshare, "--net", "--", "sleep", "30"], stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while os.readlink(f"/proc/{holder.pid}/ns/net") == own:
                if holder.poll() is not None or time.monotonic() > deadline:
                    raise SandboxError(f"`unshare --net` did not start (exit {holder.returncode})")
                time.sleep(0.001)
            _netns["fd"] = os.open(f"/proc/{holder.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            holder.kill()
            holder.wait()
        return _netns["fd"]
