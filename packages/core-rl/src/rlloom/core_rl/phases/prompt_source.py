"""Which prompts a step draws: the loader's next batch, after online filtering retired prompts at an epoch
boundary, and the curriculum sampler told each round's rewards (veRL's data.sampler, Skywork-OR1's filtering)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import PromptLoader, Row
from rlloom.core_rl.data.prompt_filter import PromptFilter, prompt_ids_of
from rlloom.core_rl.data.samplers import SamplerFeedback


class PromptSource:
    """The training prompts in the order the run draws them; its parts' states are checkpointed by the trainer."""

    def __init__(self, loader: PromptLoader, prompt_filter: PromptFilter | None, *, min_active: int) -> None:
        self.loader = loader
        self.prompt_filter = prompt_filter
        self.min_active = min_active  # online filtering never leaves fewer prompts than one batch

    def rows(self, row_ids: Sequence[int]) -> list[Row]:
        return [self.loader.rows[i] for i in row_ids]

    def next_ids(self, metrics: dict[str, float]) -> list[int]:
        """The next batch's row ids; at an epoch boundary, online filtering first retires the prompts the last
        epoch solved every time (and, if asked, never)."""
        if self.prompt_filter is not None and self.loader.epoch_finished:
            outcome = self.prompt_filter.end_epoch(num_prompts=len(self.loader.rows), min_active=self.min_active)
            if outcome.skipped:
                metrics["data/filter_skipped"] = 1.0
            self.loader.exclude(self.prompt_filter.retired)
        return self.loader.next_batch_ids()

    def record(self, step: int, trajectories: Sequence[Trajectory], row_ids: Sequence[int], prefix: str) -> None:
        """One rollout round's rewards, mapped to their rows: online filtering counts them toward the epoch's
        accuracy and a curriculum sampler's `update` sees them (a sampler without `update` costs nothing)."""
        if self.prompt_filter is not None:
            self.prompt_filter.record(
                prompt_ids_of(trajectories, row_ids, prefix), [t.reward or 0.0 for t in trajectories]
            )
        update = getattr(self.loader.sampler, "update", None)
        if update is not None:
            update(
                SamplerFeedback(
                    step=step,
                    row_ids=tuple(prompt_ids_of(trajectories, row_ids, prefix)),
                    rewards=tuple(t.reward or 0.0 for t in trajectories),
                    components=tuple(dict(t.reward_components) for t in trajectories),
                )
            )

    def metrics(self) -> dict[str, float]:
        """Online filtering's and the sampler's metrics."""
        out: dict[str, float] = {}
        if self.prompt_filter is not None:
            out.update(self.prompt_filter.metrics(len(self.loader.active_ids)))
        sampler_metrics = getattr(self.loader.sampler, "metrics", None)
        if sampler_metrics is not None:
            out.update(sampler_metrics())
        return out

    def load_filter_state(self, state: dict[str, Any] | None) -> None:
        """Restore online filtering; switched off on resume, its retired prompts come back."""
        if self.prompt_filter is None:
            self.loader.excluded = frozenset()
        elif state is not None:
            self.prompt_filter.load_state_dict(state)
