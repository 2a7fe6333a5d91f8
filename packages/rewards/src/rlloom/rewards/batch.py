"""Score many responses in a pool of worker processes that no scorer can hang, crash or starve of memory.

`concurrent.futures.ProcessPoolExecutor` cannot kill a hung task (`future.result(timeout)` leaves the worker
running) and breaks entirely when a worker dies, so this module keeps its own small pool: each worker is a
long-lived `python -c` subprocess (imports such as SymPy are paid once per worker, not per item) that receives
one item at a time over a socket. The parent gives every item a deadline; a worker that overruns is SIGKILLed
with its process group and replaced, a worker that dies (segfault, `os._exit`) is replaced, and a scorer that
exhausts the worker's address-space cap (`RLIMIT_AS`) gets a `MemoryError` and its worker is replaced. The item
then scores 0 with `error` and `details["error_kind"]` set ("timeout", "crash", "memory", "exception", "load"),
results keep the input order, and a call takes at most about ceil(n / workers) * timeout.
Workers are fresh interpreters started with `subprocess` (talking over a socketpair), not `multiprocessing`
children: forking a parent that runs threads (asyncio, HTTP clients, tokenizers) can deadlock, and
multiprocessing's spawn/forkserver re-import the caller's `__main__`, which breaks unguarded user scripts.
Each worker leads its own session, so a kill also reaches any process its scorer started; deaths are seen
through a pidfd.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from tqdm import tqdm

from rlloom.rewards.batch_worker import LOADED
from rlloom.rewards.items import ErrorKind, ScoreItem, as_item, error_result, score_item
from rlloom.rewards.registry import DEFAULT_SCORERS
from rlloom.rewards.types import ScoreResult

__all__ = ["ErrorKind", "ScoreItem", "ScoringPool", "as_item", "ascore_batch", "score_batch", "score_item"]

DEFAULT_TIMEOUT = 30.0
DEFAULT_MEMORY_LIMIT_MB = 4096
DEFAULT_LOAD_TIMEOUT = 60.0
PREFETCH = 4
PREFETCH_MAX_CHARS = 16_384


_WORKER_CODE = "from rlloom.rewards.batch_worker import main; main()"


class _Worker:
    """The parent's handle on one worker: its process, its end of the socket, and the item it is scoring."""

    def __init__(self, memory_limit_mb: int | None) -> None:
        parent_sock, child_sock = socket.socketpair()
        env = dict(os.environ)
        # the worker must import what the caller can (scorer modules next to a script, test directories)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE, str(child_sock.fileno()), str(memory_limit_mb or 0)],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        finally:
            child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.pidfd: int | None = None
        if hasattr(os, "pidfd_open"):
            try:
                self.pidfd = os.pidfd_open(self.process.pid)
            except OSError:
                self.pidfd = None
        self.queue: deque[int] = deque()  # indices sent and not yet answered; the head is being scored
        self.specs: dict[int, str] = {}  # scorer spec of each queued index
        self.loaded: set[str] = set()  # specs this worker has imported
        self.deadline = 0.0
        self.per_item = 0.0

    def waitables(self) -> list[Any]:
        return [self.conn] + ([self.pidfd] if self.pidfd is not None else [])

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        self.close_handles()

    def close_handles(self) -> None:
        self.conn.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _exit_reason(process: subprocess.Popen[bytes]) -> str:
    try:
        code = process.wait(timeout=1)
    except subprocess.TimeoutExpired:
        return "stopped answering"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class ScoringPool:
    """A reusable pool of scoring workers; use as a context manager or call `close()`.

    Reuse one pool across training steps: workers keep their imported scorers, so only the first batch pays
    the import cost. One batch runs at a time per pool (calls are serialised by a lock).
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
        load_timeout: float = DEFAULT_LOAD_TIMEOUT,
        progress: bool = False,
    ) -> None:
        self.n_workers = workers if workers is not None else (os.cpu_count() or 1)
        if self.n_workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}; use score_batch(workers=0) to score in-process")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.timeout, self.memory_limit_mb, self.progress = timeout, memory_limit_mb, progress
        self.load_timeout = load_timeout
        self._deadlines: dict[int, float] = {}  # the current call's per-item deadlines, by item index
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self.respawns = 0
        self._finalizer = weakref.finalize(self, ScoringPool._shutdown, self._workers)

    def _spawn(self) -> _Worker:
        return _Worker(self.memory_limit_mb)

    def _replace(self, worker: _Worker, pending: deque[int] | None = None) -> _Worker:
        """Kill a worker and start a fresh one; items queued behind its current one go back to `pending`."""
        if pending is not None:
            pending.extendleft(reversed(worker.queue))
            worker.queue.clear()
        worker.kill()
        fresh = self._spawn()
        self._workers[self._workers.index(worker)] = fresh
        self.respawns += 1
        return fresh

    def _ensure_started(self) -> None:
        while len(self._workers) < self.n_workers:
            self._workers.append(self._spawn())

    def score(
        self, items: Sequence[Any], *, timeout: float | None = None, scorer: str | None = None
    ) -> list[ScoreResult]:
        """Score every item (see `as_item` for accepted shapes); results in input order, never raises per item."""
        parsed = [as_item(x, i, scorer) for i, x in enumerate(items)]
        per_item = timeout if timeout is not None else self.timeout
        # an item that declares its own budget (code tests' `time_budget`) gets it, plus room to start its sandbox:
        # a slow program then fails its tests inside the scorer instead of the pool killing the scorer
        self._deadlines = {i: max(per_item, declared_seconds(item)) for i, item in enumerate(parsed)}
        with self._lock:
            self._ensure_started()
            return self._run(parsed, per_item)

    def _dispatch(self, worker: _Worker, index: int, item: ScoreItem, per_item: float) -> bool:
        """Queue one item on a worker; False (the caller re-queues it) if the worker had died meanwhile."""
        try:
            worker.conn.send((index, item.spec(), item.response, item.ground_truth, item.extra_info))
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            return False
        worker.queue.append(index)
        worker.specs[index] = item.spec()
        if len(worker.queue) == 1:
            self._start_clock(worker, per_item)
        return True

    def _start_clock(self, worker: _Worker, per_item: float) -> None:
        """The head of a worker's queue is the item it is scoring now: its deadline runs from here. Until the
        worker has imported that item's scorer, the deadline also covers start-up and import time."""
        worker.per_item = self._deadlines.get(worker.queue[0], per_item)
        cold = worker.specs[worker.queue[0]] not in worker.loaded
        worker.deadline = time.monotonic() + worker.per_item + (self.load_timeout if cold else 0.0)

    def _fill(self, worker: _Worker, pending: deque[int], items: list[ScoreItem], per_item: float) -> _Worker:
        # Up to PREFETCH items wait in a worker's socket so it never idles between items; big items are sent
        # only to an idle worker, so a send can never block the parent behind a hung scorer.
        while pending and len(worker.queue) < PREFETCH:
            index = pending[0]
            if worker.queue and len(items[index].response) > PREFETCH_MAX_CHARS:
                break
            pending.popleft()
            if not self._dispatch(worker, index, items[index], per_item):
                pending.appendleft(index)
                worker = self._replace(worker, pending)
        return worker

    def _run(self, items: list[ScoreItem], per_item: float) -> list[ScoreResult]:
        results: list[ScoreResult | None] = [None] * len(items)
        pending: deque[int] = deque()
        for i, item in enumerate(items):
            spec = item.spec()
            if ":" not in spec:
                known = ", ".join(sorted(DEFAULT_SCORERS))
                results[i] = error_result(
                    "load", f"unknown data_source {spec!r}; known: {known}, or give a scorer spec"
                )
            else:
                # resolved here so workers honour registry.register() calls made in this process
                items[i] = item.model_copy(update={"scorer": spec})
                pending.append(i)
        bar = tqdm(total=len(items), desc="scoring", unit="item", disable=not self.progress)
        bar.update(len(items) - len(pending))

        def finish(worker: _Worker, result: ScoreResult) -> None:
            index = worker.queue.popleft()
            results[index] = result
            worker.loaded.add(worker.specs.pop(index))
            bar.update(1)
            if worker.queue:
                self._start_clock(worker, per_item)

        try:
            while True:
                for worker in list(self._workers):
                    self._fill(worker, pending, items, per_item)
                busy = [w for w in self._workers if w.queue]
                if not busy:
                    break
                wait_for = max(0.0, min(w.deadline for w in busy) - time.monotonic())
                if any(w.pidfd is None for w in busy):
                    wait_for = min(wait_for, 0.1)  # no pidfd: notice deaths by polling
                ready = set(wait([x for w in busy for x in w.waitables()], timeout=wait_for))
                now = time.monotonic()
                for worker in busy:
                    died = worker.pidfd in ready or (worker.pidfd is None and worker.process.poll() is not None)
                    if worker.conn in ready or died:
                        self._collect(worker, finish, pending)
                    elif now >= worker.deadline:
                        finish(
                            worker,
                            error_result("timeout", f"scorer timed out after {worker.per_item:g} s; worker killed"),
                        )
                        self._replace(worker, pending)
        finally:
            bar.close()
        return [r if r is not None else error_result("crash", "internal: item was never scored") for r in results]

    def _collect(self, worker: _Worker, finish: Any, pending: deque[int]) -> None:
        try:
            while worker.conn.poll():
                first, result, exiting = worker.conn.recv()
                if first == LOADED:
                    worker.loaded.add(worker.specs[worker.queue[0]])
                    worker.deadline = time.monotonic() + worker.per_item
                    continue
                score, components, extracted, error, details = result
                finish(
                    worker,
                    ScoreResult.model_construct(
                        score=score, components=components, extracted=extracted, error=error, details=details
                    ),
                )  # no re-validation: the worker built it as a ScoreResult
                if exiting:
                    self._replace(worker, pending)
                    return
            if worker.process.poll() is None:
                return  # the worker is still scoring
        except (EOFError, OSError, ConnectionResetError):
            pass
        if worker.queue:
            reason = _exit_reason(worker.process)
            finish(worker, error_result("crash", f"scorer worker died ({reason}); worker replaced"))
        self._replace(worker, pending)

    async def ascore(
        self, items: Sequence[Any], *, timeout: float | None = None, scorer: str | None = None
    ) -> list[ScoreResult]:
        """`score` without blocking the event loop (runs in a thread; workers are separate processes)."""
        return await asyncio.to_thread(self.score, items, timeout=timeout, scorer=scorer)

    @staticmethod
    def _shutdown(workers: list[_Worker]) -> None:
        for worker in workers:
            with contextlib.suppress(OSError, ValueError):
                worker.conn.send(None)
        deadline = time.monotonic() + 1.0
        for worker in workers:
            try:
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
                worker.close_handles()
            except subprocess.TimeoutExpired:
                worker.kill()
        workers.clear()

    def close(self) -> None:
        """Stop the workers (politely, then by SIGKILL after 1 s)."""
        with self._lock:
            self._finalizer()

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


SANDBOX_GRACE_S = 10.0
"""What a scorer with a declared budget gets beyond it: a sandbox's start and teardown."""


def declared_seconds(item: ScoreItem) -> float:
    """The deadline an item asks for: its `extra_info["time_budget"]` (seconds, as the code scorers read it) plus
    `SANDBOX_GRACE_S`; 0 when it declares none."""
    budget = (item.extra_info or {}).get("time_budget")
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not budget > 0:
        return 0.0
    return float(budget) + SANDBOX_GRACE_S


def score_batch(
    items: Sequence[Any],
    *,
    workers: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    scorer: str | None = None,
    memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
    progress: bool = False,
    pool: ScoringPool | None = None,
) -> list[ScoreResult]:
    """Score items safely in worker processes; one `ScoreResult` per item, in order.

    `workers=None` uses one per CPU core; `workers=0` scores in this process (fast for trusted scorers, but no
    timeout or crash protection; exceptions still become error results). Pass `pool=` to reuse workers across
    calls. `scorer` is the default for items that name neither a scorer nor a data_source.
    """
    if pool is not None:
        return pool.score(items, timeout=timeout, scorer=scorer)
    if workers == 0:
        parsed = [as_item(x, i, scorer) for i, x in enumerate(items)]
        out = []
        for item in tqdm(parsed, desc="scoring", unit="item", disable=not progress):
            try:
                out.append(score_item(item))
            except Exception as exc:
                out.append(error_result("exception", f"{type(exc).__name__}: {exc}"))
        return out
    with ScoringPool(workers, timeout=timeout, memory_limit_mb=memory_limit_mb, progress=progress) as own:
        return own.score(items, scorer=scorer)


async def ascore_batch(
    items: Sequence[Any],
    *,
    workers: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    scorer: str | None = None,
    memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
    progress: bool = False,
    pool: ScoringPool | None = None,
) -> list[ScoreResult]:
    """`score_batch` for asyncio code: the event loop keeps running while workers score."""
    return await asyncio.to_thread(
        score_batch,
        items,
        workers=workers,
        timeout=timeout,
        scorer=scorer,
        memory_limit_mb=memory_limit_mb,
        progress=progress,
        pool=pool,
    )
