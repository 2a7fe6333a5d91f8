"""Finished groups waiting to be trained, and the groups still being generated, shared by the generator thread and
the trainer: AReaL's admission rule bounds how many start, and the trainer takes the oldest first."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from rlloom.core_rl.contracts.trajectory import Trajectory


def admits(started: int, version: int, *, max_staleness: int, batch_size: int) -> bool:
    """AReaL's rule (Fu et al. 2025, eq. 3 with eta = `max_staleness`): one more group may start while the groups
    started so far number fewer than (version + eta + 1) x batch size, `version` being the updates the engine has."""
    return started < (version + max_staleness + 1) * batch_size


@dataclass(slots=True)
class Group:
    """One prompt's samples: where its row came from (draw, position), the engine version it started under, and,
    once finished, its scored trajectories."""

    index: int  # order of admission, from 0 at the run's start or resume
    draw: int  # which batch of rows drawn from the loader (1, 2, ... as the steps of a synchronous run)
    position: int  # the row's position in its draw
    row_id: int
    start_version: int  # batches the trainer had taken when it started (AReaL's version)
    trajectories: list[Trajectory] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)
    penalties: list[float] = field(default_factory=list)
    record_prefix: str = ""  # the group-id prefix and rows `PromptSource.record` maps its samples by
    record_rows: list[int] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, int]:
        return (self.draw, self.position)


class GeneratorError(RuntimeError):
    """The generator thread stopped on an error; raised where the trainer waits for a batch."""


class GroupBuffer:
    """Thread-safe: groups in flight by index, finished groups, and a condition the trainer waits on."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._in_flight: dict[int, Group] = {}
        self._finished: list[Group] = []
        self._error: BaseException | None = None

    def started(self, group: Group) -> None:
        with self._cond:
            self._in_flight[group.index] = group

    def finished(self, group: Group) -> None:
        with self._cond:
            self._in_flight.pop(group.index, None)
            self._finished.append(group)
            self._cond.notify_all()

    def failed(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def counts(self) -> tuple[int, int]:
        """(finished, in flight)."""
        with self._cond:
            return len(self._finished), len(self._in_flight)

    def pending(self) -> list[Group]:
        """Every group not yet taken, finished or in flight."""
        with self._cond:
            return [*self._finished, *self._in_flight.values()]

    def take(self, batch_size: int, *, oldest_version: int, timeout: float | None = None) -> tuple[list[Group], int]:
        """Wait until `batch_size` groups are finished and none in flight started under a version below
        `oldest_version` (those must be in this batch, or their staleness would exceed the bound), then return
        the `batch_size` oldest (start version, then admission order) and how many were finished at that moment."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._error is not None:
                    raise GeneratorError(f"the rollout generator failed: {self._error!r}") from self._error
                late = any(g.start_version < oldest_version for g in self._in_flight.values())
                if len(self._finished) >= batch_size and not late:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no batch of {batch_size} groups within {timeout} s")
                self._cond.wait(left)
            ready = len(self._finished)
            self._finished.sort(key=lambda g: (g.start_version, g.index))
            batch, self._finished = self._finished[:batch_size], self._finished[batch_size:]
            return sorted(batch, key=lambda g: g.index), ready


__all__ = ["GeneratorError", "Group", "GroupBuffer", "admits"]
