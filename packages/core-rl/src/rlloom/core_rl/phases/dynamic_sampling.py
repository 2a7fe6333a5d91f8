"""A step's scored batch: one rollout round, or with DAPO's dynamic sampling (Yu et al. 2025) as many rounds as it
takes to fill the batch with groups whose rewards differ (EasyR1: whose mean lies in a band). The synchronous
trainer runs the rounds in its step; one-step off-policy on its rollout worker, with the weights it started under."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlloom.core_rl.algorithms import filter_groups_by_mean, filter_zero_variance_groups
from rlloom.core_rl.config.schema import AlgorithmConfig, ConfigError, DynamicSamplingConfig
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.observe.metrics import PhaseTimer
from rlloom.core_rl.phases.collection import RewardErrorReport
from rlloom.core_rl.phases.prompt_source import PromptSource
from rlloom.core_rl.phases.reward_shaping import OVERLONG_COMPONENT, overlong_metrics
from rlloom.core_rl.phases.rollout_round import RoundRunner


@dataclass(slots=True)
class StepBatch:
    """The trajectories a step trains on and the metrics of how they were drawn."""

    trajectories: list[Trajectory]
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def skipped_update(self) -> bool:
        return bool(self.metrics.get("dynamic_sampling/skipped_update"))


@dataclass(slots=True)
class SampledRound:
    """One round's rows and scored trajectories, as `PromptSource.record` takes them."""

    row_ids: list[int]
    prefix: str
    trajectories: list[Trajectory]


@dataclass(slots=True)
class SampledStep:
    """A step's batch with every round's scoring errors, and its rounds (for a caller that records them later)."""

    batch: StepBatch
    errors: list[str | None]
    rounds: list[SampledRound]


def collect_step_batch(
    prompts: PromptSource,
    rounds: RoundRunner,
    algorithm: AlgorithmConfig,
    *,
    step: int,
    sampling: SamplingParams,
    batch_size: int,
    reward_errors: RewardErrorReport,
    timer: PhaseTimer,
) -> StepBatch:
    """Rollout + reward; with dynamic sampling, more rounds until `batch_size` groups are useful or
    `algorithm.dynamic_sampling.max_rounds` is reached. No useful group at all: the step skips its update."""
    sampled = sample_rounds(
        prompts, rounds, algorithm, step=step, sampling=sampling, batch_size=batch_size, timer=timer
    )
    reward_errors.report(sampled.errors, step=step)
    return sampled.batch


def sample_rounds(
    prompts: PromptSource,
    rounds: RoundRunner,
    algorithm: AlgorithmConfig,
    *,
    step: int,
    sampling: SamplingParams,
    batch_size: int,
    timer: PhaseTimer,
    first_ids: list[int] | None = None,
    metrics: dict[str, float] | None = None,
    record: bool = True,
) -> SampledStep:
    """`collect_step_batch`'s rounds, shared with one-step off-policy, whose worker thread runs them: there the
    first round's rows are drawn beforehand on the main thread (`first_ids`, with their `metrics`), and with
    `record=False` the rounds are returned for the main thread to `record_rounds` once the batch is taken, so the
    prompt source's sampler is only ever updated there (later rounds of the same batch are then drawn without the
    earlier rounds' feedback, as the async generator draws)."""
    kept: list[Trajectory] = []
    groups: list[str] = []
    metrics = metrics if metrics is not None else {}
    errors: list[str | None] = []
    penalties: list[float] = []  # every round's, so the overlong metrics describe the whole step's sampling
    done: list[SampledRound] = []
    seen_groups = 0
    dynamic = algorithm.dynamic_sampling
    for round_index in range(1, (dynamic.max_rounds if dynamic is not None else 1) + 1):
        prefix = f"s{step}r{round_index}"
        row_ids = first_ids if round_index == 1 and first_ids is not None else prompts.next_ids(metrics)
        scored = rounds.run(prompts.rows(row_ids), sampling, prefix, timer)
        errors += scored.errors
        if algorithm.overlong is not None:
            penalties += scored.penalties
            metrics.update(overlong_metrics(penalties))
        done.append(SampledRound(row_ids, prefix, scored.trajectories))
        if record:
            prompts.record(step, scored.trajectories, row_ids, prefix)
        if dynamic is None:
            return SampledStep(StepBatch(scored.trajectories, metrics), errors, done)
        keep = kept_samples(scored.trajectories, dynamic)
        seen_groups += len(row_ids)
        for traj, ok in zip(scored.trajectories, keep, strict=True):
            if ok:
                if traj.group_id not in groups:
                    groups.append(traj.group_id)
                kept.append(traj)
        if len(groups) >= batch_size:
            break
    metrics["dynamic_sampling/rounds"] = float(round_index)
    metrics["dynamic_sampling/kept_group_frac"] = len(groups) / max(seen_groups, 1)
    metrics["dynamic_sampling/dropped_groups"] = float(seen_groups - len(groups))  # groups without signal
    if not kept:
        # No group had signal: DAPO trains on none of them. An update on all-zero advantages would still move the
        # weights (AdamW's momentum and weight decay) and cost a full forward/backward, so the step only logs its
        # rollouts.
        metrics["dynamic_sampling/skipped_update"] = 1.0
        return SampledStep(StepBatch(scored.trajectories, metrics), errors, done)
    wanted = set(groups[:batch_size])
    return SampledStep(StepBatch([t for t in kept if t.group_id in wanted], metrics), errors, done)


def record_rounds(prompts: PromptSource, step: int, rounds: list[SampledRound]) -> None:
    """Give the prompt source each round's rewards, in the order they were drawn."""
    for sampled in rounds:
        prompts.record(step, sampled.trajectories, sampled.row_ids, sampled.prefix)


def kept_samples(trajectories: list[Trajectory], dynamic: DynamicSamplingConfig) -> list[bool]:
    """Per sample: whether its group carries signal by `dynamic`'s rule (rewards that differ, or a mean inside
    `filter_band`). The async generator asks it of one group at a time."""
    if not trajectories:
        return []
    scores = torch.tensor([filter_score(t, dynamic.filter_key) for t in trajectories], dtype=torch.float32)
    group_ids = [t.group_id for t in trajectories]
    if dynamic.filter_band is not None:
        low, high = dynamic.filter_band
        return [bool(k) for k in filter_groups_by_mean(scores, group_ids, low=low, high=high).tolist()]
    return [bool(k) for k in filter_zero_variance_groups(scores, group_ids).tolist()]


def filter_score(traj: Trajectory, filter_key: str | None) -> float:
    """What dynamic sampling judges a sample by: the `filter_key` reward component, else the task score (the
    reward without the overlong penalty, as DAPO filters on accuracy: a length penalty alone is no signal). A
    sample whose scoring failed counts as 0."""
    if filter_key is None:
        return (traj.reward or 0.0) - traj.reward_components.get(OVERLONG_COMPONENT, 0.0)
    if filter_key in traj.reward_components:
        return float(traj.reward_components[filter_key])
    if traj.reward_error is not None:
        return 0.0
    raise ConfigError(
        f"algorithm.dynamic_sampling.filter_key: {filter_key!r} is not among the reward components of a sample "
        f"({', '.join(sorted(traj.reward_components)) or 'none'}); name one of them, or set "
        "algorithm.dynamic_sampling.filter_key=null to filter on the reward"
    )
