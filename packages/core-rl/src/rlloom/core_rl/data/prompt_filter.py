"""Online prompt filtering (Skywork-OR1, He et al. 2025, arXiv 2505.22312; DeepScaleR-style): retire prompts the
policy already solves every time, and optionally those it never solves, once per epoch.

During an epoch the trainer records, for every prompt it samples, how many of its `n` samples were solved (reward
≥ `data.solved_threshold`). At the next epoch boundary the prompts whose accuracy over that epoch was exactly 1.0
(`data.filter_solved`) or exactly 0.0 (`data.filter_unsolved`) are retired: the loader never serves them again.
Such groups have zero GRPO advantage, so they only cost rollout time. Retiring never empties the data: when it
would leave fewer prompts than one batch, nothing is retired that epoch and a warning says so. The accuracy of the
epoch in progress and the retired ids are state, saved in every checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlloom.core_rl.contracts.trajectory import Trajectory

logger = logging.getLogger(__name__)


def prompts_to_retire(
    solved: Mapping[int, int], sampled: Mapping[int, int], *, drop_solved: bool, drop_unsolved: bool
) -> tuple[set[int], set[int]]:
    """(all-solved ids, never-solved ids) among the prompts of `sampled` (id → samples drawn, `solved` id → how
    many were solved); each set is empty unless asked for."""
    all_solved = {pid for pid, count in sampled.items() if count > 0 and solved.get(pid, 0) == count}
    never_solved = {pid for pid, count in sampled.items() if count > 0 and solved.get(pid, 0) == 0}
    return (all_solved if drop_solved else set()), (never_solved if drop_unsolved else set())


def prompt_ids_of(trajectories: Sequence[Trajectory], row_ids: Sequence[int], prefix: str) -> list[int]:
    """The data-row id of each trajectory, read from its group id `f"{prefix}-{i}"` (i = the row's position in the
    batch handed to the `CollectFn`, the convention of every collector in rlloom)."""
    row_of = {f"{prefix}-{i}": rid for i, rid in enumerate(row_ids)}
    unknown = sorted({t.group_id for t in trajectories} - row_of.keys())
    if unknown:
        raise ValueError(
            "online prompt filtering (data.filter_solved / data.filter_unsolved) and curriculum samplers "
            f"(data.sampler) map samples to prompts by group id '<prefix>-<row position>' (here '{prefix}-0' ...), "
            f"but the collector returned group ids {unknown[:3]}; make the CollectFn follow that convention or "
            "switch them off"
        )
    return [row_of[t.group_id] for t in trajectories]


@dataclass
class EpochOutcome:
    """What one epoch boundary did: the newly retired ids, or why nothing was retired."""

    solved: set[int] = field(default_factory=set)
    unsolved: set[int] = field(default_factory=set)
    skipped: bool = False  # True when retiring would have left fewer prompts than one batch


class PromptFilter:
    """Per-prompt solve counts of the epoch in progress, and the prompts retired so far."""

    def __init__(self, *, drop_solved: bool, drop_unsolved: bool, solved_threshold: float) -> None:
        self.drop_solved = drop_solved
        self.drop_unsolved = drop_unsolved
        self.solved_threshold = float(solved_threshold)
        self.sampled: dict[int, int] = {}
        self.solved: dict[int, int] = {}
        self.retired_solved: set[int] = set()
        self.retired_unsolved: set[int] = set()

    @property
    def retired(self) -> set[int]:
        return self.retired_solved | self.retired_unsolved

    def record(self, prompt_ids: Sequence[int], rewards: Sequence[float]) -> None:
        """Count one sample per (prompt id, reward) pair toward this epoch's accuracy."""
        if len(prompt_ids) != len(rewards):
            raise ValueError(f"PromptFilter.record: {len(prompt_ids)} prompt ids for {len(rewards)} rewards")
        for pid, reward in zip(prompt_ids, rewards, strict=True):
            self.sampled[pid] = self.sampled.get(pid, 0) + 1
            self.solved[pid] = self.solved.get(pid, 0) + int(reward >= self.solved_threshold)

    def end_epoch(self, *, num_prompts: int, min_active: int) -> EpochOutcome:
        """Retire this epoch's all-solved (and never-solved) prompts unless fewer than `min_active` of the
        `num_prompts` would remain; then start counting the next epoch."""
        solved, unsolved = prompts_to_retire(
            self.solved, self.sampled, drop_solved=self.drop_solved, drop_unsolved=self.drop_unsolved
        )
        self.sampled, self.solved = {}, {}
        solved -= self.retired
        unsolved -= self.retired | solved
        remaining = num_prompts - len(self.retired | solved | unsolved)
        if (solved or unsolved) and remaining < min_active:
            logger.warning(
                "online prompt filtering would retire %d solved and %d unsolved prompts, leaving %d of %d, fewer than "
                "one batch (%d); keeping them all this epoch. Lower data.train_batch_size or add prompts.",
                len(solved), len(unsolved), remaining, num_prompts, min_active,
            )  # fmt: skip
            return EpochOutcome(skipped=True)
        self.retired_solved |= solved
        self.retired_unsolved |= unsolved
        return EpochOutcome(solved=solved, unsolved=unsolved)

    def metrics(self, active_prompts: int) -> dict[str, float]:
        """Prompts retired so far (cumulative) and still in play."""
        return {
            "data/filtered_solved": float(len(self.retired_solved)),
            "data/filtered_unsolved": float(len(self.retired_unsolved)),
            "data/active_prompts": float(active_prompts),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "sampled": dict(self.sampled),
            "solved": dict(self.solved),
            "retired_solved": sorted(self.retired_solved),
            "retired_unsolved": sorted(self.retired_unsolved),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sampled = {int(k): int(v) for k, v in state["sampled"].items()}
        self.solved = {int(k): int(v) for k, v in state["solved"].items()}
        self.retired_solved = {int(i) for i in state["retired_solved"]}
        self.retired_unsolved = {int(i) for i in state["retired_unsolved"]}
