"""Which isolation this machine gives untrusted code, found once per process by running a probe program in it.

`isolation()` reports what the probe verified from inside a sandboxed process; `require()` is what every checker
calls first, and refuses weak isolation unless the caller opted in.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from rlloom.rewards.code.containment import Mode, SandboxError, WeakIsolationError, stdlib_dirs
from rlloom.rewards.code.runner import Limits, run_program


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
    memfd_blocked: bool = Field(
        default=False,
        description="memfd_create fails (seccomp, x86_64 and aarch64): no memory the run's budget cannot count.",
    )
    python: str = Field(description="Interpreter that runs the programs.")
    reason: str = Field(default="", description="Why the strong mode is unavailable, if it is.")


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
for d in ("/", "/etc", "/usr", "/dev"):
    try:
        open(d + "/.rlloom-probe", "w").close()
        os.unlink(d + "/.rlloom-probe")
        facts["ro"] = 0
    except OSError:
        pass
facts["procs"] = len([p for p in os.listdir("/proc") if p.isdigit()])
facts["top"] = ",".join(sorted(os.listdir("/")))
try:
    os.close(os.memfd_create("probe"))
    facts["memfd"] = 1
except OSError:
    facts["memfd"] = 0
print(";".join(f"{k}={v}" for k, v in facts.items()))
"""

_lock = threading.Lock()
_found: dict[str, Isolation] = {}  # "active" -> the probe's verdict, cached per process


def _probe(mode: Mode, python: str) -> Isolation:
    run = run_program({"kind": "script", "code": _PROBE}, mode=mode, python=python, limits=Limits(timeout=20.0))
    if run.status != "ok":
        raise SandboxError(f"probe failed under {mode}: {run.status} {run.stderr[-500:]}")
    facts = dict(item.split("=", 1) for item in run.stdout.strip().split(";"))
    no_network = facts["ifaces"] == "lo"
    read_only = facts["ro"] == "1"
    unprivileged = facts["uid"] != "0"
    own_pids = facts["pid"] == "2" and facts["procs"] == "2"  # the supervisor is 1, the program 2, no others
    allowed = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc", "tmp", "site"}
    allowed |= {Path(p).parts[1] for p in stdlib_dirs()}
    minimal_root = set(facts["top"].split(",")) <= allowed
    strong = no_network and read_only and unprivileged and own_pids and minimal_root
    return Isolation(
        mode=mode, strong=strong, no_network=no_network, read_only_root=read_only, unprivileged=unprivileged,
        own_pid_namespace=own_pids, minimal_root=minimal_root, memfd_blocked=facts.get("memfd") == "0",
        python=python,
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
