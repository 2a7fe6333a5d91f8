"""Which isolation this machine gives untrusted code, found once by probing, and the command that applies it.

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
import sys
import threading
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

HARNESS = Path(__file__).with_name("sandboxed.py")
Mode = Literal["namespaces", "rlimits"]
# No --net: creating a network namespace per run costs 10-25 ms, so every run joins one empty namespace instead.
UNSHARE_FLAGS = ("--pid", "--mount", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc")


class WeakIsolationError(RuntimeError):
    """Raised when only weak isolation is available and the caller did not opt in to it."""


class SandboxError(RuntimeError):
    """Raised when the sandbox itself failed (not the program inside it)."""


class Isolation(BaseModel):
    """What the probe found: the active mode and each property it verified from inside a sandboxed process."""

    model_config = ConfigDict(frozen=True)

    mode: Mode = Field(description="namespaces (strong) or rlimits (weak: network and /tmp reachable).")
    strong: bool = Field(description="True when network, filesystem and process isolation all hold.")
    no_network: bool = Field(description="The program sees no network interface except loopback.")
    read_only_root: bool = Field(description="Writes outside the private working directory fail.")
    unprivileged: bool = Field(description="The program runs as a non-root uid, so RLIMIT_NPROC binds.")
    own_pid_namespace: bool = Field(description="The program cannot see or signal processes outside its run.")
    minimal_root: bool = Field(
        default=False, description="Only system dirs, /dev, /proc, the stdlib and /tmp exist: no homes, repo, data."
    )
    python: str = Field(description="Interpreter that runs the programs.")
    reason: str = Field(default="", description="Why the strong mode is unavailable, if it is.")


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


_PROBE = r"""
import os
facts = {"uid": os.geteuid(), "pid": os.getpid()}
try:
    with open("/proc/net/dev") as f:
        names = [line.split(":")[0].strip() for line in f.readlines()[2:]]
    facts["ifaces"] = ",".join(names)
except OSError:
    facts["ifaces"] = "?"
facts["ro"] = 1
for d in ("/", "/etc", "/usr", "/dev/shm"):
    try:
        open(d + "/.rlloom-probe", "w").close()
        os.unlink(d + "/.rlloom-probe")
        facts["ro"] = 0
    except OSError:
        pass
facts["procs"] = len([p for p in os.listdir("/proc") if p.isdigit()])
facts["top"] = ",".join(sorted(os.listdir("/")))
print(";".join(f"{k}={v}" for k, v in facts.items()))
"""

_lock = threading.Lock()
_found: dict[str, Isolation] = {}  # "active" -> the probe's verdict, cached per process


def _probe(mode: Mode, python: str) -> Isolation:
    from rlloom.rewards.code.runner import Limits, run_program

    run = run_program({"kind": "script", "code": _PROBE}, mode=mode, python=python, limits=Limits(timeout=20.0))
    if run.status != "ok":
        raise SandboxError(f"probe failed under {mode}: {run.status} {run.stderr[-500:]}")
    facts = dict(item.split("=", 1) for item in run.stdout.strip().split(";"))
    no_network = facts["ifaces"] == "lo"
    read_only = facts["ro"] == "1"
    unprivileged = facts["uid"] != "0"
    own_pids = facts["pid"] == "1" and facts["procs"] == "1"
    allowed = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc", "tmp"}
    allowed |= {Path(p).parts[1] for p in stdlib_dirs()}
    minimal_root = set(facts["top"].split(",")) <= allowed
    strong = no_network and read_only and unprivileged and own_pids and minimal_root
    return Isolation(
        mode=mode, strong=strong, no_network=no_network, read_only_root=read_only, unprivileged=unprivileged,
        own_pid_namespace=own_pids, minimal_root=minimal_root, python=python,
    )  # fmt: skip


def isolation(*, refresh: bool = False) -> Isolation:
    """Probe (once per process) and report the isolation that `execute` will use."""
    with _lock:
        if "active" in _found and not refresh:
            return _found["active"]
        python = sys.executable
        reasons = []
        if os.geteuid() != 0:
            reasons.append("namespaces mode needs root (CI and the dev machines run as root)")
        elif shutil.which("unshare") is None:
            reasons.append("util-linux `unshare` not found: apt-get install util-linux")
        else:
            try:
                found = _probe("namespaces", python)
                if found.strong:
                    _found["active"] = found
                    return found
                reasons.append(f"namespaces probe did not verify every property: {found}")
            except SandboxError as exc:
                reasons.append(str(exc))
        weak = _probe("rlimits", python)
        _found["active"] = weak.model_copy(update={"strong": False, "reason": "; ".join(reasons)})
        return _found["active"]


def require(allow_weak_isolation: bool) -> Isolation:
    """The active isolation, or a clear error when it is weak and the caller did not opt in."""
    found = isolation()
    if not found.strong and not allow_weak_isolation:
        raise WeakIsolationError(
            f"only weak isolation ({found.mode}) is available: {found.reason}. Untrusted code would have network "
            "access and could write to /tmp. Run as root on Linux with util-linux, or pass "
            "allow_weak_isolation=True to accept the risk."
        )
    return found
