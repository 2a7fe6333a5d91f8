"""Turning prompts into scored trajectories: single-turn sampling through a `RolloutEngine`, then rewards.

Multi-turn agents bring their own `collect` function with the same signature (rows, sampling, step) →
trajectories; the trainer does not care which produced them.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.contracts.protocols import RewardFn, RewardLike, RewardOutput, RolloutEngine
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import DataError, Row, generation_request, ground_truth

CollectFn = Callable[[Sequence[Row], SamplingParams, str], list[Trajectory]]
"""(rows, sampling, group-id prefix) → trajectories, `sampling.n` per row, sharing the group id
`f"{prefix}-{i}"` for the row at position i (online prompt filtering maps samples back to rows by it)."""

CollectFactory = Callable[[RolloutEngine], CollectFn]
"""Builds a `CollectFn` on the trainer's engine: for collectors that need the engine an `EngineFactory` builds
inside the `Trainer` (e.g. rlloom.agent's multi-turn `agent_collector`)."""

logger = logging.getLogger(__name__)


def single_turn_collector(engine: RolloutEngine, chat_template_kwargs: Mapping[str, Any] | None = None) -> CollectFn:
    """A `CollectFn` that samples `n` completions per prompt from `engine` (chat prompts rendered with
    `chat_template_kwargs`, `data.apply_chat_template_kwargs`)."""

    def collect(rows: Sequence[Row], sampling: SamplingParams, prefix: str) -> list[Trajectory]:
        requests = [generation_request(row, sampling, chat_template_kwargs) for row in rows]
        return sample_trajectories(engine, rows, requests, prefix)

    return collect


def sample_trajectories(
    engine: RolloutEngine, rows: Sequence[Row], requests: Sequence[GenerationRequest], prefix: str
) -> list[Trajectory]:
    """Send one request per row and turn every completion into a `Trajectory` (group id `f"{prefix}-{i}"`).

    A request's `multimodal` inputs ride along on its trajectories, so the actor's forward sees what the engine
    decoded with (collectors of image prompts build such requests and share this step).
    """
    return trajectories_from_completions(rows, requests, engine.generate(list(requests)), prefix)


def trajectories_from_completions(
    rows: Sequence[Row], requests: Sequence[GenerationRequest], outputs: Sequence[Sequence[Completion]], prefix: str
) -> list[Trajectory]:
    """Each request's completions as trajectories of the group `f"{prefix}-{i}"` (i = the row's position)."""
    if len(outputs) != len(rows):
        raise RuntimeError(f"rollout engine returned {len(outputs)} results for {len(rows)} requests")
    trajectories = []
    for i, (row, request, completions) in enumerate(zip(rows, requests, outputs, strict=True)):
        for completion in completions:
            trajectories.append(
                Trajectory(
                    prompt_ids=list(completion.prompt_ids),
                    response_ids=list(completion.token_ids),
                    loss_mask=[1] * len(completion.token_ids),
                    rollout_logprobs=list(completion.logprobs) if completion.logprobs is not None else None,
                    policy_versions=(
                        list(completion.policy_versions) if completion.policy_versions is not None else None
                    ),
                    group_id=f"{prefix}-{i}",
                    data_source=str(row.get("data_source", "")),
                    ground_truth=ground_truth(row),
                    prompt_messages=[dict(m) for m in request.messages] if request.messages else None,
                    response_text=completion.text,
                    finish_reason=completion.finish_reason,
                    multimodal=request.multimodal,
                    extra_info=dict(row.get("extra_info") or {}),
                )
            )
    return trajectories


class GuardedReward:
    """A reward function that can neither stop nor stall the run: each call runs on a daemon thread with a deadline
    (`trainer.reward_timeout_s`); a call that raises or runs past it scores its batch 0, each with the reason, as
    `RegistryReward` does for one scorer. The trainer reports such errors once each and stops only if every reward
    of the first step failed. A call past its deadline keeps its thread (Python cannot stop one); the error says so.
    """

    def __init__(self, reward_fn: RewardFn, timeout_s: float) -> None:
        self.reward_fn = reward_fn
        self.timeout_s = timeout_s

    def __call__(self, trajectories: Sequence[Trajectory]) -> Sequence[RewardLike]:
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["rewards"] = self.reward_fn(trajectories)
            except Exception as exc:
                outcome["error"] = exc

        worker = threading.Thread(target=run, name="rlloom-reward", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            return self._failed(
                trajectories,
                f"the reward function did not return within trainer.reward_timeout_s={self.timeout_s:g} s (its call "
                "is left running); scored 0. Raise the limit if scoring is this slow, or find what hangs",
            )
        if "error" in outcome:
            exc = outcome["error"]
            return self._failed(trajectories, f"the reward function raised {type(exc).__name__}: {exc}; scored 0")
        rewards: Sequence[RewardLike] = outcome["rewards"]
        return rewards

    @staticmethod
    def _failed(trajectories: Sequence[Trajectory], error: str) -> list[RewardLike]:
        return [RewardOutput(0.0, {}, error) for _ in trajectories]


def score(trajectories: Sequence[Trajectory], reward_fn: RewardFn) -> list[str | None]:
    """Fill `reward` and `reward_components` of each trajectory in place; returns each one's scoring error.

    A nan or inf score is a scoring error (scored 0, reported like any other): left in, it would make its whole
    group's advantages nan and every update of the step non-finite, so the optimizer would skip them all.
    """
    outputs = reward_fn(trajectories)
    if len(outputs) != len(trajectories):
        raise RuntimeError(f"reward function returned {len(outputs)} rewards for {len(trajectories)} trajectories")
    errors: list[str | None] = []
    for traj, out in zip(trajectories, outputs, strict=True):
        value, error = float(out.score), str(out.error) if out.error else None
        if not math.isfinite(value):
            error = error or f"the reward function returned a non-finite score ({value}); scored 0 instead"
            value = 0.0
        traj.reward = value
        traj.reward_components = dict(out.components)
        traj.reward_error = error
        if error:
            traj.metrics["reward_error"] = 1.0
        errors.append(error)
    return errors


class RewardErrorReport:
    """Scoring errors on the console, not only as `rollout/reward_error/mean` in metrics.jsonl.

    Each distinct error message is logged once (a warning, with how many rewards it hit in that step): a row
    whose `data_source` has no scorer, or that has no ground truth, scores 0 and would otherwise train silently
    on no signal. If every reward of the first step checked failed, the run stops with a `DataError`.
    """

    SHOWN_PER_STEP = 5

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.first_step_checked = False

    def report(self, errors: Sequence[str | None], *, step: int, split: str = "train") -> None:
        failed = Counter(error for error in errors if error)
        total = sum(failed.values())
        first = split == "train" and not self.first_step_checked
        if split == "train":
            self.first_step_checked = True
        if first and errors and total == len(errors):
            listed = "; ".join(f"{message} (x{count})" for message, count in failed.most_common(self.SHOWN_PER_STEP))
            raise DataError(
                f"every reward of the first training step failed ({total} of {len(errors)}): {listed}. Check the "
                "rows' data_source (it picks the scorer) and reward_model.ground_truth, or the reward function"
            )
        new = [(message, count) for message, count in failed.most_common() if message not in self.seen]
        for message, count in new[: self.SHOWN_PER_STEP]:
            logger.warning(
                "%s step %d: %d of %d rewards failed (scored 0): %s [each distinct error is shown once; "
                "rollout/reward_error/mean counts them every step]",
                split,
                step,
                count,
                len(errors),
                message,
            )
        if len(new) > self.SHOWN_PER_STEP:
            logger.warning("%s step %d: %d more distinct reward errors", split, step, len(new) - self.SHOWN_PER_STEP)
        self.seen.update(failed)
