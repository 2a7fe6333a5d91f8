"""The generator of `trainer.mode=async`: a worker thread with its own asyncio loop that starts groups as AReaL's
admission rule allows and pushes each finished, scored group into the `GroupBuffer`; it never waits for an update.

Rows come from the run's `PromptSource` in draws of one batch (the order a synchronous run draws them); each group
is one row, generated and scored by the run's `RoundRunner` on a worker thread of its own. With
max_staleness=0 a whole draw is one collect call under the group ids and order of the synchronous trainer, which
is what makes its results the same.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from rlloom.core_rl.config.schema import DynamicSamplingConfig
from rlloom.core_rl.config.streaming import StreamingConfig
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.observe.metrics import PhaseTimer
from rlloom.core_rl.phases.dynamic_sampling import kept_samples
from rlloom.core_rl.phases.prompt_source import PromptSource
from rlloom.core_rl.phases.rollout_round import RoundRunner
from rlloom.core_rl.streaming.buffer import Group, GroupBuffer, admits
from rlloom.core_rl.streaming.calls import LoopGenerate


@dataclass(slots=True)
class Draw:
    """One batch of rows drawn from the loader, and the loader's position before it (a checkpoint's resume point)."""

    number: int
    row_ids: list[int]
    loader_state: dict[str, Any]
    skip: set[int] = field(default_factory=set)  # positions trained before a resume


class StreamingGenerator:
    """Starts groups while `admits(...)` holds and fewer than `max_groups_in_flight` run; `wake()` after a push
    or a batch taken. `version()` is the engine's weights version, which labels the tokens."""

    def __init__(
        self,
        prompts: PromptSource,
        rounds: RoundRunner,
        streaming: StreamingConfig,
        buffer: GroupBuffer,
        *,
        batch_size: int,
        version: Callable[[], int],
        total_groups: int,
        started: int,
        first_draw: int,
        generating: Callable[[], AbstractContextManager[None]] = nullcontext,
    ) -> None:
        self.prompts, self.rounds, self.streaming, self.buffer = prompts, rounds, streaming, buffer
        self.batch_size = batch_size
        self.version = version
        self.total_groups = total_groups
        # groups started since the run began (trained ones included, dropped ones not: a dropped group frees its
        # admission slot, as AReaL's rejected rollouts do)
        self.started = started
        self.next_index = started  # admission order of the next group (dropped ones keep theirs)
        # batches the trainer has taken: AReaL's version in the admission rule (the weights' version stands still
        # through critic warm-up steps, which still consume batches)
        self.consumed = started // batch_size
        self.next_draw = first_draw
        self.generating = generating  # held around each group's generation (the update gate, when one is needed)
        self.sampling = SamplingParams()
        self.max_tokens_at: Callable[[int], int] = lambda _draw: self.sampling.max_tokens
        self.skips: dict[int, set[int]] = {}  # draw number → positions already trained (a resume)
        self.draws: deque[Draw] = deque()  # draws with groups not yet started
        self.draw_log: dict[int, Draw] = {}  # every draw with a group not yet trained (checkpoints read it)
        self.lock = threading.Lock()  # the loader and the draw log, read by the trainer's checkpoint
        self.idle_s = 0.0
        self.metrics: dict[str, float] = {}
        self.on_loop: LoopGenerate | None = None  # engine calls served on this generator's loop
        # DAPO's dynamic sampling per finished group: groups without signal are dropped while fewer than
        # `drop_budget` wait since the trainer's last batch, kept afterwards
        self.dynamic: DynamicSamplingConfig | None = None
        self.drop_budget = 0
        self._stop = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._thread_main, name="rlloom-async-rollout", daemon=True)
        # a thread per group that may be in flight: at most (eta + 1) x batch size by admission. Not the loop's
        # default executor, which the engine's agenerate may need while every group's thread waits on it
        most = (streaming.max_staleness + 1) * batch_size
        limit = streaming.max_groups_in_flight
        self._workers = ThreadPoolExecutor(min(most, limit or most), thread_name_prefix="rlloom-async-group")

    # ----------------------------------------------------------------- control (trainer thread)
    def start(self) -> None:
        if self._thread.ident is None:
            self._thread.start()

    def wake(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    def stop(self) -> None:
        self._stop = True
        self.wake()
        if self._thread.is_alive():
            self._thread.join()

    # ----------------------------------------------------------------- the loop (generator thread)
    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # the trainer sees it where it waits for a batch
            self.buffer.failed(exc)

    async def _main(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        if self.on_loop is not None:
            self.on_loop.loop = self._loop
        tasks: set[asyncio.Task[None]] = set()
        limit = self.streaming.max_groups_in_flight
        while not self._stop:
            while not self._stop and (limit is None or len(tasks) < limit) and self._may_start():
                task = asyncio.create_task(self._generate(self._next_unit()))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(lambda _t: self._wake.set() if self._wake else None)
            idle_from = time.monotonic() if not tasks else None
            await self._wake.wait()
            self._wake.clear()
            if idle_from is not None:
                self.idle_s += time.monotonic() - idle_from
        if tasks:  # stopping: let the groups in progress finish (their threads cannot be cancelled)
            await asyncio.wait(list(tasks))
        self._workers.shutdown(wait=False)

    def _may_start(self) -> bool:
        if self.started >= self.total_groups:
            return False
        eta = self.streaming.max_staleness
        return admits(self.started, self.consumed, max_staleness=eta, batch_size=self.batch_size)

    def _next_unit(self) -> list[Group]:
        """The next group to start, or with max_staleness=0 the whole next draw (one collect call, as sync)."""
        whole = self.streaming.max_staleness == 0
        draw = self._current_draw()
        positions = [i for i in range(len(draw.row_ids)) if i not in draw.skip]
        taken = positions if whole else positions[:1]
        draw.skip.update(taken)
        if len(draw.skip) == len(draw.row_ids):
            self.draws.popleft()
        unit = []
        for position in taken:
            group = Group(self.next_index, draw.number, position, draw.row_ids[position], self.consumed)
            self.started += 1
            self.next_index += 1
            self.buffer.started(group)
            unit.append(group)
        return unit

    def _current_draw(self) -> Draw:
        """The oldest draw with a group not yet started; draws the next batch of rows when there is none."""
        while not self.draws:
            with self.lock:
                state = self.prompts.loader.state_dict()
                metrics: dict[str, float] = {}
                row_ids = self.prompts.next_ids(metrics)
                draw = Draw(self.next_draw, row_ids, state, skip=set(self.skips.pop(self.next_draw, set())))
                self.draw_log[draw.number] = draw
            self.metrics.update(metrics)
            self.next_draw += 1
            if len(draw.skip) < len(draw.row_ids):
                self.draws.append(draw)
        return self.draws[0]

    async def _generate(self, unit: list[Group]) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._workers, self._generate_unit, unit)
        except Exception as exc:  # stop starting groups; the trainer raises it where it waits
            self._stop = True
            self.buffer.failed(exc)
            return
        for group in unit:
            if self._drops(group):
                self.started -= 1  # another group may start in its place
                self.buffer.dropped(group)
            else:
                self.buffer.finished(group)

    def _drops(self, group: Group) -> bool:
        """Whether dynamic sampling drops this finished group: its rewards carry no signal and the budget of
        drops for the coming batch is not spent (then it is trained as it is, as sync's last round would)."""
        if self.dynamic is None or self.buffer.dropped_count() >= self.drop_budget:
            return False
        return not all(kept_samples(group.trajectories, self.dynamic))

    def _generate_unit(self, unit: list[Group]) -> None:
        """Generate and score `unit`'s rows in one collect call; label tokens the engine left unlabelled with the
        version current when it started (the gate holds it for the whole call when the engine cannot update in
        flight)."""
        draw, whole = unit[0].draw, len(unit) > 1 or self.streaming.max_staleness == 0
        prefix = f"s{draw}r1" if whole else f"s{draw}r1-{unit[0].position}"
        rows = self.prompts.rows([g.row_id for g in unit])
        sampling = self.sampling.model_copy(update={"max_tokens": self.max_tokens_at(draw)})
        with self.generating():
            version = self.version()
            scored = self.rounds.run(rows, sampling, prefix, PhaseTimer())
        by_group: dict[str, list[int]] = {}
        for i, traj in enumerate(scored.trajectories):
            if traj.policy_versions is None:
                traj.policy_versions = [version] * len(traj.response_ids)
            by_group.setdefault(traj.group_id, []).append(i)
        for offset, group in enumerate(unit):
            index = by_group.get(f"{prefix}-{offset}", [])
            group.trajectories = [scored.trajectories[i] for i in index]
            group.errors = [scored.errors[i] for i in index]
            group.penalties = [scored.penalties[i] for i in index] if scored.penalties else []
            group.record_prefix = prefix
            group.record_rows = [g.row_id for g in unit]
        extra = scored.errors[len(scored.trajectories) :]  # ReMax baselines' scoring errors
        if extra:
            unit[0].errors += extra


__all__ = ["Draw", "StreamingGenerator"]
