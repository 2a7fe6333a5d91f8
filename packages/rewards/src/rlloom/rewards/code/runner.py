"""Start one sandboxed program, feed it, watch it, and kill its whole tree at the deadline.

The job travels to the harness in a memfd (no pipe to block on), the tests in a second one (read only by
the supervisor), stdin in a third, and the supervisor's result records come back on a pipe of their own. One
thread per run multiplexes stdout, stderr, the records and a pidfd, caps every stream, and kills on a wall-clock
deadline; the CPU limit is an rlimit. In namespaces mode the kill goes to the PID namespace's first process (the
supervisor), which takes every process of the run with it.
"""

from __future__ import annotations

import contextlib
import functools
import marshal
import math
import os
import secrets
import select
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rlloom.rewards.code.containment import (
    Mode,
    SandboxError,
    hidden_stdlib,
    launcher,
    mentions_scientific,
    site_packages,
    stdlib_dirs,
)

SETUP_FAILED = 121
_HERE = Path(__file__).parent


@functools.cache
def harness_modules() -> list[tuple[str, CodeType]]:
    """The harness's modules in import order, compiled once per process and sent with every job, so a sandbox
    start compiles none of them (no .pyc can be relied on; compiling them took ~25 ms a run on a loaded machine)."""
    found = []
    for name in ("wire", "channel", "meters", "supervisor"):
        path = _HERE / f"{name}.py"
        found.append((name, compile(path.read_text(), str(path), "exec", dont_inherit=True, optimize=0)))
    return found


ExecStatus = Literal["ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error"]
_ENV_BASE = {
    "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
    # numpy's BLAS would start a thread per host core: over the run's process limit, and its CPU is one budget
    "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
}  # fmt: skip


class Limits(BaseModel):
    """Resource limits for one program run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout: float = Field(default=5.0, gt=0, le=3600, description="Wall-clock seconds; CPU time is capped too.")
    cpu_seconds: float | None = Field(
        default=None, gt=0, le=3600,
        description="CPU seconds of all the run's processes together (one budget they share, whatever the kernel's "
        "scheduler groups), checked every 20 ms; None: the timeout rounded up, plus one.",
    )  # fmt: skip
    memory_mb: int = Field(
        default=512,
        ge=64,
        description="Memory budget of the whole run in MiB: the resident memory of all its processes together "
        "(supervisor and test code included), its System V shared memory, its tmpfs files (/tmp, /dev/shm) and "
        "what its sockets hold in flight, checked every 20 ms; also each process's address-space cap and the "
        "largest message a test receives.",
    )
    max_processes: int = Field(default=16, ge=1, description="Processes and threads the program may have.")
    max_file_mb: int = Field(default=16, ge=1, description="Largest file the program may write, in MiB.")
    max_open_files: int = Field(default=64, ge=16, description="Open file descriptors.")
    output_bytes: int = Field(default=1 << 20, ge=1024, description="stdout cap; stderr gets a quarter of it.")
    tmpfs_mb: int = Field(default=64, ge=1, description="Size of the private working directory (namespaces).")


@dataclass
class Run:
    """A finished run, with the harness's records already checked against the nonce."""

    status: ExecStatus
    exit_code: int | None
    stdout: str
    stderr: str
    duration: float
    records: list[tuple[str, str, str]] = field(default_factory=list)  # (index or END, P/F/count, reason)
    forged: bool = False


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the PID namespace's first process, which takes every process in the namespace with it.

    `unshare` (our child) then reaps it and exits by itself, so no zombie is handed to the host's init. Without
    a namespace (weak mode, or before `unshare` forked) the session's process group is killed instead.
    """
    try:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            children = [int(pid) for pid in f.read().split()]
    except (OSError, ValueError):
        children = []
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if not children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _parse_records(raw: bytes, nonce: str) -> tuple[list[tuple[str, str, str]], bool]:
    """Complete lines stamped with the nonce; any other complete line means the channel was forged."""
    lines = raw.split(b"\n")
    records, forged = [], False
    for line in lines[:-1]:  # the last piece is empty or an unfinished line cut by a kill
        parts = line.decode("utf-8", "replace").split(" ", 3)
        if len(parts) < 2 or parts[0] != nonce:
            forged = True
            continue
        records.append((parts[1], parts[2] if len(parts) > 2 else "", parts[3] if len(parts) > 3 else ""))
    return records, forged


def run_program(
    job: dict[str, Any],
    *,
    mode: Mode,
    python: str,
    limits: Limits,
    stdin: str | bytes | None = None,
    tests: list[Any] | None = None,
) -> Run:
    """Run one harness job under `mode` and `limits`; never raises for anything the program does.

    The scientific packages are mounted when the job's code names one or the caller sets `job["scientific"]`
    (its tests do: the harness checks their text, which never travels in the job the candidate sees)."""
    job = dict(job)
    scientific = bool(job.pop("scientific", False)) or mentions_scientific(str(job.get("code", "")))
    nonce = secrets.token_hex(16)
    uid = 1_000_000 + secrets.randbelow(1 << 30)
    workdir = "/tmp" if mode == "namespaces" else tempfile.mkdtemp(prefix="rlloom-code-")
    if mode != "namespaces" and os.geteuid() == 0:
        os.chown(workdir, uid, uid)
    cpu = math.ceil(limits.timeout) + 1 if limits.cpu_seconds is None else math.ceil(limits.cpu_seconds)
    rlimits = {
        "RLIMIT_CPU": cpu, "RLIMIT_AS": limits.memory_mb << 20, "RLIMIT_FSIZE": limits.max_file_mb << 20,
        "RLIMIT_NOFILE": limits.max_open_files, "RLIMIT_NPROC": limits.max_processes, "RLIMIT_CORE": 0,
        "RLIMIT_MSGQUEUE": 0, "RLIMIT_MEMLOCK": 1 << 16,  # POSIX message queues and locked pages: kernel memory
    }  # fmt: skip
    cfg = {
        **job, "nonce": nonce, "mode": mode, "uid": uid, "workdir": workdir, "limits": rlimits,
        "tmpfs_mb": limits.tmpfs_mb, "budget_mb": limits.memory_mb, "stdlib": stdlib_dirs(),
        "cpu_budget": limits.cpu_seconds if limits.cpu_seconds is not None else cpu,
        "stdlib_hidden": bool(hidden_stdlib()), "site": [list(p) for p in site_packages()] if mode == "namespaces" and
        scientific else [], "modules": harness_modules(),
    }  # fmt: skip
    cfg_fd = _memfd("rlloom-job", marshal.dumps(cfg))
    tests_fd = _memfd("rlloom-tests", marshal.dumps(tests or []))
    stdin_fd = _memfd("rlloom-stdin", stdin.encode() if isinstance(stdin, str) else stdin) if stdin else None
    res_r, res_w = os.pipe()
    env = {**_ENV_BASE, "HOME": workdir, "TMPDIR": workdir}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [*launcher(mode, python), str(cfg_fd), str(tests_fd), str(res_w)],
            stdin=stdin_fd if stdin_fd is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(cfg_fd, tests_fd, res_w), env=env,
            start_new_session=True, cwd="/" if mode == "namespaces" else workdir,
        )  # fmt: skip
    except OSError as exc:
        raise SandboxError(f"could not start the sandbox ({mode}): {exc}") from exc
    finally:
        for fd in (cfg_fd, tests_fd, res_w, stdin_fd):
            if fd is not None:
                os.close(fd)
    try:
        return _watch(proc, res_r, nonce=nonce, limits=limits, start=start, cpu=cpu)
    finally:
        os.close(res_r)
        if mode != "namespaces":
            shutil.rmtree(workdir, ignore_errors=True)


def _watch(proc: subprocess.Popen[bytes], res_r: int, *, nonce: str, limits: Limits, start: float, cpu: int) -> Run:
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    caps = {out_fd: limits.output_bytes, err_fd: limits.output_bytes // 4, res_r: 1 << 20}
    data: dict[int, bytearray] = {fd: bytearray() for fd in caps}
    pidfd = os.pidfd_open(proc.pid)
    sel = selectors.DefaultSelector()
    for fd in caps:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    sel.register(pidfd, selectors.EVENT_READ)
    deadline, grace_end = start + limits.timeout, None
    verdict: ExecStatus | None = None
    try:
        while verdict is None:
            now = time.monotonic()
            end = deadline if grace_end is None else min(deadline, grace_end)
            if now >= end:
                verdict = "timeout" if grace_end is None else None
                break
            for key, _ in sel.select(end - now):
                fd = int(key.fd)
                if fd == pidfd:  # the program's tree is gone; let the pipes drain briefly
                    sel.unregister(pidfd)
                    grace_end = time.monotonic() + 0.5
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    continue
                room = caps[fd] - len(data[fd])
                data[fd] += chunk[:room]
                if len(chunk) > room:
                    verdict = "output_limit"
            if grace_end is not None and not sel.get_map():
                break
    finally:
        sel.close()
        _kill_tree(proc)
        # Stop reading for good: `unshare` may still write to a pipe we left full (after an output cap), and
        # would block there instead of exiting; a closed read end makes that write fail at once.
        proc.stdout.close()
        proc.stderr.close()
        if not select.select([pidfd], [], [], 5.0)[0]:  # unshare did not finish: take the whole session down
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        _, status, usage = os.wait4(proc.pid, 0)
        os.close(pidfd)
        proc.returncode = os.waitstatus_to_exitcode(status)
    duration = time.monotonic() - start
    stdout = bytes(data[out_fd]).decode("utf-8", "replace")
    stderr = bytes(data[err_fd]).decode("utf-8", "replace")
    records, forged = _parse_records(bytes(data[res_r]), nonce)
    sealed = bool(records) and records[0][0] == "SEALED"
    body = records[1:] if sealed else records
    reported = [value for key, value, _ in body if key == "EXIT"]  # how the candidate's own process ended
    over_budget = any(key == "MEMORY" for key, _, _ in body)
    over_cpu = any(key == "CPU" for key, _, _ in body)
    body = [r for r in body if r[0] not in ("EXIT", "MEMORY", "CPU")]
    # A run we stopped (deadline, output cap) died of our SIGKILL; `unshare`'s own status would say 1 or SIGPIPE.
    # One the supervisor stopped for its CPU budget ends as a CPU rlimit would end a process: SIGXCPU.
    code = -signal.SIGKILL if verdict is not None else proc.returncode
    if verdict is None and sealed and reported and reported[-1].lstrip("-").isdigit():
        code = int(reported[-1])
    if verdict is None and over_cpu:
        code = -signal.SIGXCPU
    if verdict is None:
        if not sealed:
            verdict = "sandbox_error" if code == SETUP_FAILED or not records else "killed"
        elif over_budget:
            verdict = "memory"
        elif over_cpu:
            verdict = "timeout"
        elif code == 0:
            verdict = "ok"
        elif code == -signal.SIGKILL and usage.ru_utime + usage.ru_stime >= cpu - 0.05:
            verdict = "timeout"
        elif code in (-signal.SIGXFSZ,):
            verdict = "output_limit"
        elif code < 0:
            verdict = "killed"
        elif "[Errno 27] File too large" in stderr[-2000:]:  # RLIMIT_FSIZE (Python ignores SIGXFSZ)
            verdict = "output_limit"
        elif "MemoryError" in stderr[-2000:]:
            verdict = "memory"
        else:
            verdict = "error"
    return Run(verdict, code, stdout, stderr, duration, body, forged)
