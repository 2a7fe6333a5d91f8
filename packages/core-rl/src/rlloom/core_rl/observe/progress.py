"""One progress line every few seconds during a long phase of a step, so a 60-75 s step on a CPU is not silent.

The trainer's `PhaseTimer` opens a phase for every timed part of a step (`rollout`, `update_actor`, ...); code deep
inside it reports what it finished with `advance`, without being passed anything: a rollout engine each finished
conversation and its tokens, the actor each mini-batch of its update. At most one line per `EVERY_S` seconds is
written (to stderr, where the console tracker's step lines also go), naming the phase, the count (of a known total
when the reporter gave one), tokens and their rate when reported, and the seconds so far:

    [rollout] 24 conversations, 3,072 tokens (118 tokens/s), 26 s
    [update_actor] mini-batch 3/8, 41 s
    [update_actor] mini-batch 3/8; 16 conversations, 2,048 tokens (50 tokens/s), 41 s   (one-step off-policy)

A phase that ends before `EVERY_S` writes nothing; `advance` outside any phase does nothing. Thread-safe: vLLM's
batcher and the async engine's loop report from their own threads.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

EVERY_S = 5.0
"""Seconds between two lines of one phase at least."""


class ProgressLine:
    """The running counts of one phase and when it last wrote a line."""

    def __init__(
        self,
        phase: str,
        *,
        every_s: float | None = None,
        write: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.phase, self.clock = phase, clock
        self.every_s = EVERY_S if every_s is None else every_s
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.started = self.last = clock()
        self.counts: dict[str, list[int | None]] = {}  # unit -> [done, total or None], in first-reported order
        self.tokens = 0
        self.lines = 0
        self._lock = threading.Lock()

    def advance(self, count: int = 1, *, tokens: int = 0, total: int | None = None, unit: str = "done") -> None:
        """Add `count` finished `unit`s (and `tokens`); write a line if `every_s` passed since the last one."""
        with self._lock:
            entry = self.counts.setdefault(unit, [0, None])
            entry[0] = int(entry[0] or 0) + count
            entry[1] = total if total is not None else entry[1]
            self.tokens += tokens
            now = self.clock()
            if now - self.last < self.every_s:
                return
            self.last = now
            line = self.line(now)
            self.lines += 1
        self.write(line)

    def line(self, now: float) -> str:
        """`[phase] count[/total] unit; ...[, tokens (rate)], seconds`; mini-batches read `mini-batch i/n`."""
        elapsed = now - self.started
        parts = []
        for unit, (done, total) in self.counts.items():
            of = f"/{total}" if total is not None else ""
            parts.append(f"{unit} {done}{of}" if unit == "mini-batch" else f"{done:,}{of} {unit}")
        rate = f", {self.tokens:,} tokens ({self.tokens / elapsed:,.0f} tokens/s)" if self.tokens and elapsed else ""
        return f"[{self.phase}] {'; '.join(parts)}{rate}, {elapsed:.0f} s"


_open: list[ProgressLine] = []  # the phases running now, innermost last
_lock = threading.Lock()


@contextlib.contextmanager
def phase(
    name: str, *, every_s: float | None = None, write: Callable[[str], None] | None = None
) -> Iterator[ProgressLine]:
    """Make `name` the phase `advance` reports to while the block runs (`PhaseTimer` opens one per timed phase);
    a phase opened inside another reports to itself and gives the outer one back at its end."""
    line = ProgressLine(name, every_s=every_s, write=write)
    with _lock:
        _open.append(line)
    try:
        yield line
    finally:
        with _lock:
            _open.remove(line)


def advance(count: int = 1, *, tokens: int = 0, total: int | None = None, unit: str = "done") -> None:
    """Report `count` finished `unit`s (and their `tokens`) to the running phase; a no-op outside one."""
    with _lock:
        line = _open[-1] if _open else None
    if line is not None:
        line.advance(count, tokens=tokens, total=total, unit=unit)
