"""Run the SymPy check in a forked child process that is killed when it overruns, so no input hangs the caller.

Signal-based timeouts (Math-Verify's `signal.alarm`) only work in the main thread and cannot interrupt C-level
big-integer work; a killed process always stops. One long-lived child per (process, thread) serves requests
over a pipe, so the fork cost is paid once, not per answer; on timeout it is SIGKILLed and the next call forks a
fresh one. The child caps its own address space, so a memory blow-up ends in a MemoryError inside the child.
`os.fork` is used directly (not `multiprocessing.Process`) because pool workers are daemonic and may not start
`multiprocessing` children. Where fork is unavailable the check runs in-process, bounded only by `guard.py`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import threading
from multiprocessing.connection import Connection, Pipe

from rlloom.rewards.math.numeric import MIN_SIGNIFICANT
from rlloom.rewards.math.symbolic import symbolic_equal

CHILD_MEMORY_HEADROOM = 2 * 1024**3


def _limit_memory() -> None:
    try:
        import resource

        with open("/proc/self/statm") as statm:
            current = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = current + CHILD_MEMORY_HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError, ImportError):
        pass  # not Linux: keep the timeout as the only bound


def _serve(conn: Connection, parent: int) -> None:
    """Child loop: answer (pred, gold) requests until the parent goes away."""
    _limit_memory()
    while True:
        if not conn.poll(1.0):
            if os.getppid() != parent:
                return
            continue
        try:
            pred, gold, precision = conn.recv()
        except (EOFError, OSError):
            return
        try:
            result = symbolic_equal(pred, gold, precision)
        except MemoryError:
            result = (False, "sympy ran out of memory")
        conn.send(result)


@functools.cache
def _warm_up() -> None:
    """Run one trivial check in this process before the first fork, so children inherit SymPy's lazily-loaded
    modules and caches instead of paying for them (seconds on a busy machine) inside every first timeout."""
    symbolic_equal("\\sin^2 x + \\cos^2 x", "1")


class SymbolicWorker:
    """A forked child that runs `symbolic_equal` with a hard wall-clock timeout."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._conn: Connection | None = None
        self._owner = os.getpid()

    def _start(self) -> None:
        _warm_up()
        parent_end, child_end = Pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # child
            parent_end.close()
            code = 0
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                _serve(child_end, parent)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        child_end.close()
        self._pid, self._conn, self._owner = pid, parent_end, parent

    def stop(self) -> None:
        """Kill the child (if any) and reap it."""
        if self._pid is not None and self._owner == os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self._pid, 0)
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
        self._pid = self._conn = None

    def check(self, pred: str, gold: str, timeout: float, precision: int = MIN_SIGNIFICANT) -> tuple[bool, str]:
        """`symbolic_equal(pred, gold, precision)` in the child; (False, "timeout ...") past `timeout`."""
        if self._owner != os.getpid():  # we were forked: the child belongs to our parent
            self._pid = self._conn = None
            self._owner = os.getpid()
        if self._pid is None:
            self._start()
        assert self._conn is not None
        try:
            self._conn.send((pred, gold, precision))
            if self._conn.poll(timeout):
                result: tuple[bool, str] = self._conn.recv()
                return result
        except (EOFError, OSError):
            self.stop()
            return False, "symbolic worker died"
        self.stop()
        return False, f"timeout after {timeout:g} s"


_local = threading.local()
_workers: list[SymbolicWorker] = []
_workers_lock = threading.Lock()


def _stop_all() -> None:
    for worker in _workers:
        worker.stop()


atexit.register(_stop_all)


def bounded_symbolic_equal(pred: str, gold: str, timeout: float, precision: int = MIN_SIGNIFICANT) -> tuple[bool, str]:
    """Compare with SymPy under a hard `timeout` (seconds), in this thread's own worker process."""
    if not hasattr(os, "fork"):
        return symbolic_equal(pred, gold, precision)
    worker: SymbolicWorker | None = getattr(_local, "worker", None)
    if worker is None:
        worker = SymbolicWorker()
        _local.worker = worker
        with _workers_lock:
            _workers.append(worker)
    return worker.check(pred, gold, timeout, precision)
