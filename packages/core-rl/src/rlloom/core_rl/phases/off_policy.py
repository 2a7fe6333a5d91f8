"""One-step off-policy training: the next batch is generated while the trainer updates on this one.

Synchronous RL leaves the generator idle during the update and the trainer idle during generation. veRL's
`one_step_off_policy` recipe (and AReaL/PipelineRL further) overlap them: the batch trained at step t was
sampled with the weights of step t − 2 while step t − 1 trained, so each step costs about max(generation,
update) instead of their sum, at the price of a policy lag of one step (the PPO ratio and TIS correct for it).
`BackgroundRollouts` holds that one batch in flight on a worker thread; the trainer decides what it generates
and when the engine's weights may change (only between batches).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from rlloom.core_rl.trajectory import Trajectory


@dataclass(slots=True)
class RolloutRound:
    """A generated and scored batch, with what the main thread logs and reports about it."""

    trajectories: list[Trajectory]
    errors: list[str | None]
    penalties: list[float]
    seconds: dict[str, float] = field(default_factory=dict)  # time the worker spent per phase
    metrics: dict[str, float] = field(default_factory=dict)
    weights_step: int = 0  # the training step whose weights the engine sampled with
    row_ids: list[int] = field(default_factory=list)  # the data rows the batch was drawn from, in request order
    prefix: str = ""  # its group ids' prefix (`f"{prefix}-{i}"` for row_ids[i])


class BackgroundRollouts:
    """At most one rollout batch in flight on a worker thread."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlloom-rollout")
        self._pending: Future[RolloutRound] | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def start(self, job: Callable[[], RolloutRound]) -> None:
        if self._pending is not None:
            raise RuntimeError("a rollout batch is already in flight; take() it first")
        self._pending = self._executor.submit(job)

    def take(self) -> RolloutRound:
        """The batch in flight, once finished (its worker's exception, if it failed)."""
        if self._pending is None:
            raise RuntimeError("no rollout batch in flight")
        pending, self._pending = self._pending, None
        return pending.result()

    def drain(self) -> None:
        """Wait until the batch in flight (if any) is finished, keeping it for `take()`: the engine is then idle
        and its weights may change."""
        if self._pending is not None:
            self._pending.exception()  # waits; a failure surfaces at take()

    def close(self) -> None:
        """Finish the batch in flight (its result is dropped) and stop the worker."""
        self.drain()
        self._pending = None
        self._executor.shutdown(wait=True)
