"""Finished groups waiting to be trained, and the groups still being generated, shared by the generator thread and
the trainer: AReaL's admission rule bounds how many start, and the trainer takes the oldest first."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from rlloom.core_rl.contracts.trajectory import Trajectory


def admits(started: int, version: int, *, max_staleness: int, batch_size: int) -> bool:
    """AReaL's rule (Fu et al. 2025, §5.1, eta = `max_staleness`): one more group may start while the groups
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
        self._dropped: list[Group] = []  # finished without signal (dynamic sampling), not yet seen by the trainer
        self._error: BaseException | None = None

    def started(self, group: Group) -> None:
        with self._cond:
            self._in_flight[group.index] = group

    def finished(self, group: Group) -> None:
        with self._cond:
            self._in_flight.pop(group.index, None)
            self._finished.append(group)
            self._cond.notify_all()

    def dropped(self, group: Group) -> None:
        """A finished group dynamic sampling does not train (its rewards carry no signal): it leaves the deadlines
        and waits only for the trainer's bookkeeping (`take_dropped`)."""
        with self._cond:
            self._in_flight.pop(group.index, None)
            self._dropped.append(group)
            self._cond.notify_all()

    def dropped_count(self) -> int:
        """Groups dropped since the trainer last took them."""
        with self._cond:
            return len(self._dropped)

    def take_dropped(self) -> list[Group]:
        """The dropped groups, once each, in admission order."""
        with self._cond:
            dropped, self._dropped = self._dropped, []
        return sorted(dropped, key=lambda g: g.index)

    def dropped_waiting(self) -> list[Group]:
        """The dropped groups not yet taken (a checkpoint marks their rows as used)."""
        with self._cond:
            return list(self._dropped)

    def failed(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def counts(self) -> tuple[int, int]:
        """(finished, in flight)."""
        with self._cond:
            return len(self._finished), len(self._in_flight)

    def waiting(self) -> list[Group]:
        """The finished groups not yet taken, in admission order (what a checkpoint saves)."""
        with self._cond:
            return sorted(self._finished, key=lambda g: g.index)

    def pending(self) -> list[Group]:
        """Every group not yet taken, finished or in flight."""
        with self._cond:
            return [*self._finished, *self._in_flight.values()]

    def take(self, batch_size: int, *, oldest_version: int, timeout: float | None = None) -> tuple[list[Group], int]:
        """Wait until this batch can be `batch_size` finished groups that leave no group past its deadline, then
        return the `batch_size` oldest (start version, then admission order) and how many were finished then.

        A group started at version c must be trained within the step that takes it below `oldest_version` + k for
        k = c − oldest_version + 1 ... : those below `oldest_version` now, those below `oldest_version` + k within
        k + 1 steps. So before taking, for each such line, the batch must hold at least (untrained groups below
        it) − k x batch_size of them, finished (earliest deadline first, waiting for the slow ones). AReaL's
        admission keeps every such count within (k + 1) x batch_size, so this never asks for more than a batch.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._error is not None:
                    raise GeneratorError(f"the rollout generator failed: {self._error!r}") from self._error
                if self._can_take(batch_size, oldest_version):
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no batch of {batch_size} groups within {timeout} s")
                self._cond.wait(left)
            ready = len(self._finished)
            self._finished.sort(key=lambda g: (g.start_version, g.index))
            batch, self._finished = self._finished[:batch_size], self._finished[batch_size:]
            return sorted(batch, key=lambda g: g.index), ready

    def _can_take(self, batch_size: int, oldest_version: int) -> bool:
        if len(self._finished) < batch_size:
            return False
        pending = [g.start_version for g in self._in_flight.values()]
        finished = [g.start_version for g in self._finished]
        for line in sorted({v + 1 for v in pending if v >= oldest_version} | {oldest_version}):
            k = line - oldest_version
            need = sum(v < line for v in pending) + sum(v < line for v in finished) - k * batch_size
            if sum(v < line for v in finished) < min(need, batch_size):
                return False
        return True


__all__ = ["GeneratorError", "Group", "GroupBuffer", "admits"]
