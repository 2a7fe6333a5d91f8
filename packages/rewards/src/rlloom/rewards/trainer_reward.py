"""A trainer's reward function over the registry: each trajectory scored by its row's `data_source` scorer.

core-rl's `Trainer` takes `reward_fn(trajectories) -> results` where each result has `score`, `components` and
`error`; `ScoreResult` has all three, so this needs no torch and no import of core-rl. Scoring runs in a
`ScoringPool` kept for the whole run (workers keep their imported scorers; untrusted code only ever runs in the
sandbox), and a scorer's failure becomes a zero score with its reason, never an exception mid-step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rlloom.rewards.batch import DEFAULT_TIMEOUT, ScoringPool
from rlloom.rewards.types import ScoreResult


class ScoredTrajectory(Protocol):
    """What the reward function reads of a trajectory (core-rl's `Trajectory` has these fields)."""

    @property
    def response_text(self) -> str: ...
    @property
    def ground_truth(self) -> Any: ...
    @property
    def data_source(self) -> str: ...
    @property
    def extra_info(self) -> Mapping[str, Any]: ...


class RegistryReward:
    """`reward_fn` for core-rl's trainer: score every trajectory with its data source's registry scorer.

    `scorer` ("module:function" or a registry name) is used for trajectories whose row has no data_source.
    `scorers` maps data_source names to the scorer to use instead of the registry's (e.g. `{"geometry3k":
    "geo3k_easyr1"}`: EasyR1's accuracy + format reward rather than plain math accuracy); the data_source still
    names the rows in metrics. Call `close()` (or use as a context manager) to stop the scoring workers.
    """

    def __init__(
        self,
        *,
        workers: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        scorer: str | None = None,
        scorers: Mapping[str, str] | None = None,
    ):
        self.pool = ScoringPool(workers, timeout=timeout)
        self.scorer = scorer
        self.scorers = dict(scorers or {})

    def __call__(self, trajectories: Sequence[ScoredTrajectory]) -> list[ScoreResult]:
        items = []
        for i, traj in enumerate(trajectories):
            if not traj.data_source and self.scorer is None:
                raise ValueError(
                    f"trajectory {i} has no data_source and RegistryReward has no default scorer; add a "
                    "'data_source' to the rows (e.g. 'gsm8k') or pass scorer='module:function'"
                )
            items.append(
                {
                    "response": traj.response_text,
                    "ground_truth": traj.ground_truth,
                    "data_source": traj.data_source or None,
                    "scorer": self.scorers.get(traj.data_source) if traj.data_source else None,
                    "extra_info": dict(traj.extra_info or {}),
                }
            )
        return self.pool.score(items, scorer=self.scorer)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> RegistryReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
