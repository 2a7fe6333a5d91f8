"""Micro-batching: requests from many clients are gathered for a short window and answered by one backend call.

The backend call runs in a worker thread so the event loop keeps accepting requests; while one batch runs, the
next one fills up, so under load batches grow by themselves and the window mostly matters when traffic is light.
A request is never split across batches, and a batch holds at most `max_batch_queries` queries unless a single
request alone is larger (the server submits a large request in pieces of `max_batch_queries`). Requests with
different `options` (say a reranker's candidate depth) are not merged: `search` gets them as extra arguments.
The number of queued queries is bounded: beyond it `submit` raises `OverloadedError` at
once (the server answers 503) instead of letting latency grow without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class OverloadedError(RuntimeError):
    """Too many queries are already waiting; the caller should retry later."""


@dataclass
class _Pending(Generic[T]):
    queries: list[str]
    k: int
    options: tuple[Any, ...]
    future: asyncio.Future[list[T]]


@dataclass
class BatchStats:
    batches: int = 0
    batched_queries: int = 0
    backend_seconds: float = 0.0
    largest_batch: int = 0


@dataclass
class MicroBatcher(Generic[T]):
    """Collects (queries, k) requests and calls `search(all_queries, max_k, *options)` once per batch in a worker
    thread.

    `search` returns one result per query; each request gets its slice, cut to its own k by `trim`.
    """

    search: Callable[..., list[T]]
    trim: Callable[[T, int], T]
    window_s: float = 0.001
    max_batch_queries: int = 1024
    max_pending_queries: int = 8192
    stats: BatchStats = field(default_factory=BatchStats)
    _waiting: deque[_Pending[T]] = field(default_factory=deque)
    _arrived: asyncio.Event | None = None
    _pending_queries: int = 0
    _task: asyncio.Task[None] | None = None
    _executor: ThreadPoolExecutor | None = None

    def start(self) -> None:
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval-backend")
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def pending_queries(self) -> int:
        return self._pending_queries

    async def submit(self, queries: list[str], k: int, options: tuple[Any, ...] = ()) -> list[T]:
        if self._arrived is None:
            raise RuntimeError("MicroBatcher.start() was not called")
        if self._pending_queries + len(queries) > self.max_pending_queries:
            raise OverloadedError(
                f"{self._pending_queries} queries are already queued (limit {self.max_pending_queries}); retry later"
            )
        future: asyncio.Future[list[T]] = asyncio.get_running_loop().create_future()
        self._pending_queries += len(queries)
        self._waiting.append(_Pending(queries, k, options, future))
        self._arrived.set()
        return await future

    async def _run(self) -> None:
        assert self._arrived is not None
        while True:
            while not self._waiting:
                self._arrived.clear()
                await self._arrived.wait()
            if self.window_s > 0 and len(self._waiting) == 1:
                # light traffic: give other clients one window to join; under load the queue is already full
                await asyncio.sleep(self.window_s)
            batch = [self._waiting.popleft()]
            size = len(batch[0].queries)
            while (
                self._waiting
                and self._waiting[0].options == batch[0].options
                and size + len(self._waiting[0].queries) <= self.max_batch_queries
            ):
                item = self._waiting.popleft()
                batch.append(item)
                size += len(item.queries)
            await self._answer(batch, size)

    async def _answer(self, batch: list[_Pending[T]], size: int) -> None:
        queries = [q for item in batch for q in item.queries]
        k = max(item.k for item in batch)
        started = time.perf_counter()
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self._executor, self.search, queries, k, *batch[0].options
            )
        except Exception as err:  # one bad batch must not stop the loop: every waiting request gets the error
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(err)
        else:
            offset = 0
            for item in batch:
                part = results[offset : offset + len(item.queries)]
                offset += len(item.queries)
                if not item.future.done():
                    item.future.set_result([self.trim(r, item.k) for r in part])
        finally:
            self._pending_queries -= size
            self.stats.batches += 1
            self.stats.batched_queries += size
            self.stats.largest_batch = max(self.stats.largest_batch, size)
            self.stats.backend_seconds += time.perf_counter() - started
