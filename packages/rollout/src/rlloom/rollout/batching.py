"""Serve many concurrent `agenerate` callers from one background thread that owns the model.

Agents interleave dozens of conversations; running each turn alone would leave the model at batch size 1.
Callers put a `Ticket` (their request plus the way back to their event loop) on a queue and await it. A worker
thread waits for the first ticket, gives others a short gathering window, then calls the engine's runner with a
`take(room)` function. `ContinuousBatcher` lets the runner call `take` again whenever it has room, so requests
that arrive while a batch decodes join it (continuous batching, `HFEngine`); `AsyncBatcher` takes one batch
per run (step-wise, for engines such as vLLM that schedule a batch themselves). Each caller is answered the
moment its own samples finish; a runner that raises fails only the callers it had taken and not yet answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest


class Ticket:
    """One queued request and the way back to its caller's event loop (thread-safe to answer, once)."""

    __slots__ = ("_future", "_loop", "answered", "cancelled", "request")

    def __init__(
        self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, future: asyncio.Future[list[Completion]]
    ) -> None:
        self.request = request
        self._loop = loop
        self._future = future
        self.answered = False
        self.cancelled = False  # set when the caller stopped waiting; the runner then drops its rows

    @property
    def rows(self) -> int:
        return self.request.sampling.n

    def deliver(self, completions: list[Completion]) -> None:
        """Hand the caller its completions."""
        self._answer(completions, None)

    def fail(self, error: BaseException) -> None:
        """Raise `error` in the caller."""
        self._answer(None, error)

    def _answer(self, completions: list[Completion] | None, error: BaseException | None) -> None:
        if self.answered:
            return
        self.answered = True
        future = self._future

        def _set() -> None:
            if future.done():  # the caller was cancelled
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(completions or [])

        with contextlib.suppress(RuntimeError):  # the caller's event loop has closed; nobody is waiting
            self._loop.call_soon_threadsafe(_set)


TakeTickets = Callable[..., list[Ticket]]
"""`take(room, accept=None)`: queued tickets in arrival order until they hold at least `room` rows (the last
may overflow), stopping early at the first ticket `accept` refuses; [] when nothing waits."""
Runner = Callable[[TakeTickets], None]
# run_batch(requests, deliver) must call deliver(i, completions) once for each request index i
BatchRunner = Callable[[list[GenerationRequest], Callable[[int, list[Completion]], None]], None]


class ContinuousBatcher:
    """A ticket queue plus one worker thread that hands the runner a `take` it may call at every step."""

    def __init__(self, run: Runner, max_rows: int = 64, gather_s: float = 0.005) -> None:
        self._run = run
        self._max_rows = max_rows
        self._gather_s = gather_s
        self._waiting: deque[Ticket] = deque()
        self._waiting_rows = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._taken: list[Ticket] = []  # tickets handed to the runner in the current run

    async def submit(self, request: GenerationRequest) -> list[Completion]:
        """Queue `request` and wait for its n completions without blocking the event loop."""
        loop = asyncio.get_running_loop()
        ticket = Ticket(request, loop, loop.create_future())
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine's batcher is closed; create a new engine to generate again.")
            self._waiting.append(ticket)
            self._waiting_rows += ticket.rows
            self._ensure_worker()
            self._cond.notify_all()
        try:
            return await ticket._future
        except asyncio.CancelledError:
            ticket.cancelled = True  # (a timeout, a failed sibling task): nobody will read its completions
            raise

    def take(self, room: int, accept: Callable[[GenerationRequest], bool] | None = None) -> list[Ticket]:
        """Waiting tickets for the runner (see `TakeTickets`); called from the worker thread only."""
        out: list[Ticket] = []
        rows = 0
        with self._cond:
            while self._waiting and rows < room:
                head = self._waiting[0]
                if accept is not None and not accept(head.request):
                    break
                self._waiting.popleft()
                self._waiting_rows -= head.rows
                out.append(head)
                rows += head.rows
        self._taken.extend(out)
        return out

    def close(self) -> None:
        """Answer what is queued, then stop the worker; later `submit` calls fail."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=30)

    def _ensure_worker(self) -> None:  # caller holds self._cond
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="rlloom-rollout-batcher", daemon=True)
            self._thread.start()

    def _wait_for_work(self) -> bool:
        """Block until a ticket waits, then give others `gather_s` to arrive; False once closed and drained."""
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if not self._waiting:
                return False
            deadline = time.monotonic() + self._gather_s
            while self._waiting_rows < self._max_rows and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(timeout=left)
        return True

    def _work(self) -> None:
        while self._wait_for_work():
            self._taken = []
            try:
                self._run(self.take)
            except Exception as exc:  # a failed run fails its callers, never the worker
                for ticket in self._taken:
                    ticket.fail(exc)
            else:
                lost = RuntimeError("the engine finished a batch without answering this request (a bug)")
                for ticket in self._taken:
                    ticket.fail(lost)  # no-op for answered tickets


class AsyncBatcher:
    """Step-wise batching: each run takes what has gathered (up to the row budget) and runs it to the end."""

    def __init__(self, run_batch: BatchRunner, max_rows: int = 64, gather_s: float = 0.005) -> None:
        self._run_batch = run_batch
        self._max_rows = max_rows
        self._queue = ContinuousBatcher(self._run_once, max_rows, gather_s)

    async def submit(self, request: GenerationRequest) -> list[Completion]:
        """Queue `request` and wait for its n completions without blocking the event loop."""
        return await self._queue.submit(request)

    def close(self) -> None:
        """Answer what is queued, then stop the worker; later `submit` calls fail."""
        self._queue.close()

    def _run_once(self, take: TakeTickets) -> None:
        tickets = [t for t in take(self._max_rows) if not t.cancelled]  # nobody waits for a cancelled one
        if not tickets:
            return
        self._run_batch([t.request for t in tickets], lambda i, completions: tickets[i].deliver(completions))
