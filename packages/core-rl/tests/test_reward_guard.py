"""A plain reward function can neither stop nor stall a run (issue 28): a call that raises or runs past
`trainer.reward_timeout_s` scores its batch 0 with the reason, reported once, and training goes on."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config

from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.phases.collection import GuardedReward
from rlloom.core_rl.trainer import Trainer


def one(reward: float) -> Trajectory:
    return Trajectory(prompt_ids=[1], response_ids=[2], loss_mask=[1], reward=reward)


def test_the_guard_passes_results_through_and_turns_failures_into_zero_scores() -> None:
    calls: list[int] = []
    release = threading.Event()

    def reward_fn(trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
        calls.append(len(trajectories))
        if len(calls) == 2:
            raise KeyError("gold")
        if len(calls) == 3:
            release.wait(30)  # hangs until the test lets it go
        return [RewardOutput(1.0, {"exact": 1.0}) for _ in trajectories]

    guarded = GuardedReward(reward_fn, timeout_s=0.3)
    batch = [one(0.0), one(0.0)]
    assert [(r.score, r.components, r.error) for r in guarded(batch)] == [(1.0, {"exact": 1.0}, None)] * 2
    raised = guarded(batch)
    assert [(r.score, r.error) for r in raised] == [(0.0, "the reward function raised KeyError: 'gold'; scored 0")] * 2
    start = time.monotonic()
    hung = guarded(batch)
    assert time.monotonic() - start < 10
    assert all(r.score == 0.0 and "did not return within trainer.reward_timeout_s=0.3 s" in r.error for r in hung)
    release.set()


def test_a_run_goes_on_past_a_reward_function_that_raises_and_one_that_hangs(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls = {"n": 0}
    release = threading.Event()

    def flaky(trajectories: Sequence[Trajectory]) -> Sequence[RewardOutput]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("scorer service down")
        if calls["n"] == 3:
            release.wait(60)
        return digit_reward(trajectories)

    overrides = ["trainer.total_steps=3", "trainer.reward_timeout_s=1"]
    trainer = Trainer(
        tiny_config(tiny_model_dir, tmp_path, overrides),
        engine=SamplingEngine(tiny_model_dir),
        reward_fn=flaky,
        train_data=sum_rows(8),
    )
    with caplog.at_level(logging.WARNING):
        trainer.fit()
    release.set()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3  # every step trained
    warnings = [r.getMessage() for r in caplog.records if "rewards failed" in r.getMessage()]
    assert len(warnings) == 2
    assert "RuntimeError: scorer service down" in warnings[0] and "step 2" in warnings[0]
    assert "did not return within trainer.reward_timeout_s=1 s" in warnings[1] and "step 3" in warnings[1]
