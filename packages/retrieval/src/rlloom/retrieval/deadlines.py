"""Deadlines for many short waits with one sweeper task, instead of one event-loop timer per wait.

The server bounds how long each request may take to send its body. On this project's 2-core machine, under
uvloop, `asyncio.timeout` around a receive cost 13-17 µs a request (a timer pushed onto the loop's heap and
cancelled again, thousands of times a second); `Deadlines` costs about 1.7 µs (a dict entry), against a bm25
request's ~150 µs in all. One sweeper wakes every `interval_s` and cancels the tasks past their deadline, so a
deadline fires up to `interval_s` late, which does not matter for a timeout of seconds.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Deadlines:
    """Deadlines for the tasks that `watch()`; the sweeper cancels a task still watched past its deadline.

    The caller catches the `CancelledError`, asks `expired(task)` whether the sweeper sent it (anything else,
    a shutdown for one, must propagate), calls `task.uncancel()` if so, and `release(task)` in all cases.
    A context manager would read better, but `contextlib`'s costs about 10 µs a request by itself.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.interval_s = min(1.0, timeout_s / 4)
        self._due: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def watch(self) -> asyncio.Task[Any] | None:
        """Start the current task's deadline (None outside a task: nothing to cancel)."""
        task = asyncio.current_task()
        if task is None:
            return None
        loop = task.get_loop()
        if self._sweeper is None or self._sweeper.done() or self._sweeper.get_loop() is not loop:
            self._sweeper = loop.create_task(self._sweep())
        self._due[task] = loop.time() + self.timeout_s
        return task

    def expired(self, task: asyncio.Task[Any] | None) -> bool:
        """Whether the sweeper cancelled `task` for its deadline."""
        return task in self._expired

    def release(self, task: asyncio.Task[Any] | None) -> None:
        """Stop watching `task`."""
        if task is not None:
            self._due.pop(task, None)
            self._expired.discard(task)

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval_s)
            now = loop.time()
            for task, due in list(self._due.items()):
                if due <= now and task not in self._expired:
                    self._expired.add(task)
                    task.cancel()
