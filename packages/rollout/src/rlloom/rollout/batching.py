"""Serve many concurrent `agenerate` callers with batched generation on one background thread.

Agents interleave dozens of conversations; running each turn alone would leave the model at batch size 1.
Callers put their request on a queue and await a future; a worker thread takes everything that is waiting
(up to a row budget, after a short gathering window), runs it as one batch, and resolves each caller's
future the moment its own samples finish, so a conversation can run its tool while the batch continues.
Requests that arrive during a batch form the next one (step-wise batching).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlloom.core_rl.generation import Completion, GenerationRequest

# run_batch(requests, deliver) must call deliver(i, completions) once for each request index i
BatchRunner = Callable[[list[GenerationRequest], Callable[[int, list[Completion]], None]], None]


@dataclass(slots=True)
class _Pending:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[Completion]]


def _resolve(pending: _Pending, completions: list[Completion] | None, error: BaseException | None) -> None:
    def _set() -> None:
        if pending.future.done():  # the caller was cancelled
            return
        if error is not None:
            pending.future.set_exception(error)
        else:
            pending.future.set_result(completions or [])

    with contextlib.suppress(RuntimeError):  # the caller's event loop has closed; nobody is waiting
        pending.loop.call_soon_threadsafe(_set)


class AsyncBatcher:
    """A queue plus one worker thread that turns concurrent requests into batched runs."""

    def __init__(self, run_batch: BatchRunner, max_rows: int = 64, gather_s: float = 0.005) -> None:
        self._run_batch = run_batch
        self._max_rows = max_rows
        self._gather_s = gather_s
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False

    async def submit(self, request: GenerationRequest) -> list[Completion]:
        """Queue `request` and wait for its n completions without blocking the event loop."""
        if self._closed:
            raise RuntimeError("AsyncBatcher is closed; create a new engine to generate again.")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Completion]] = loop.create_future()
        self._ensure_worker()
        self._queue.put(_Pending(request, loop, future))
        return await future

    def close(self) -> None:
        """Stop the worker after the batch in flight; later `submit` calls fail."""
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="rlloom-rollout-batcher", daemon=True)
                self._thread.start()

    def _gather(self, first: _Pending) -> tuple[list[_Pending], bool]:
        """`first` plus whatever else arrives within the gathering window, up to the row budget."""
        batch, rows = [first], first.request.sampling.n
        deadline = time.monotonic() + self._gather_s
        while rows < self._max_rows:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
            rows += item.request.sampling.n
        return batch, False

    def _work(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = self._gather(first)
            delivered = [False] * len(batch)

            def deliver(
                i: int,
                completions: list[Completion],
                batch: list[_Pending] = batch,
                delivered: list[bool] = delivered,
            ) -> None:
                delivered[i] = True
                _resolve(batch[i], completions, None)

            try:
                self._run_batch([p.request for p in batch], deliver)
            except Exception as exc:  # a failed batch fails its callers, never the worker
                for i, pending in enumerate(batch):
                    if not delivered[i]:
                        _resolve(pending, None, exc)
