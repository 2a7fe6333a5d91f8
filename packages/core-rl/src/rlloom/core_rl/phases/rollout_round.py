"""One rollout round: generate for a batch of prompts, score, and shape the rewards (DAPO's overlong punishment;
ReMax's greedy baseline). Runs on the rollout worker thread with `trainer.one_step_off_policy`, so it reads nothing
that the update changes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlloom.core_rl.config.schema import AlgorithmConfig
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.contracts.protocols import RewardFn
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import Row
from rlloom.core_rl.observe.metrics import PhaseTimer
from rlloom.core_rl.phases.collection import CollectFn, score
from rlloom.core_rl.phases.reward_shaping import punish_overlong


@dataclass(slots=True)
class ScoredRound:
    """A round's trajectories, their scoring errors (and the ReMax baselines'), and DAPO's overlong penalties
    (empty without `algorithm.overlong`)."""

    trajectories: list[Trajectory]
    errors: list[str | None]
    penalties: list[float]


class RoundRunner:
    """Generates and scores rounds with the run's collector and reward function."""

    def __init__(self, collect: CollectFn, reward_fn: RewardFn, algorithm: AlgorithmConfig) -> None:
        self.collect = collect
        self.reward_fn = reward_fn
        self.algorithm = algorithm

    def run(self, rows: Sequence[Row], sampling: SamplingParams, prefix: str, timer: PhaseTimer) -> ScoredRound:
        algo = self.algorithm
        with timer("rollout"):
            trajectories = self.collect(rows, sampling, prefix)
        penalties: list[float] = []
        with timer("reward"):
            errors = score(trajectories, self.reward_fn)
            if algo.overlong is not None:
                penalties = punish_overlong(
                    trajectories,
                    max_tokens=sampling.max_tokens,
                    buffer=algo.overlong.buffer,
                    penalty_factor=algo.overlong.penalty_factor,
                )
            if algo.advantage.estimator == "remax":
                errors += self.greedy_baselines(rows, trajectories, prefix, sampling)
        return ScoredRound(trajectories, errors, penalties)

    def greedy_baselines(
        self, rows: Sequence[Row], trajectories: list[Trajectory], prefix: str, sampling: SamplingParams
    ) -> list[str | None]:
        """ReMax: score one greedy response per prompt; its reward is the baseline of the prompt's samples.
        Returns the baselines' scoring errors."""
        greedy = sampling.model_copy(update={"n": 1, "temperature": 0.0})
        baselines = self.collect(rows, greedy, prefix)
        errors = score(baselines, self.reward_fn)
        by_group = {t.group_id: t.reward for t in baselines}
        for traj in trajectories:
            traj.extra_info["remax_baseline"] = by_group[traj.group_id]
        return errors
