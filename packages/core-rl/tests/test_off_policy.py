"""trainer.one_step_off_policy: each batch is generated one step behind, while the previous update runs."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config

from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.schema import ConfigError
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.actor import PolicyActor

OFF_POLICY = ["trainer.one_step_off_policy=true", "trainer.total_steps=3", "actor.warmup_steps=0"]


def checksum(module: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in module.parameters()))


class WeightRecordingEngine(SamplingEngine):
    """Notes the checksum of the weights it samples with at every generate call."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__(model_dir)
        self.sampled_with: list[float] = []

    def generate(self, requests: Any) -> Any:
        self.sampled_with.append(checksum(self.model))
        return super().generate(requests)


def trainer_for(model_dir: Path, out: Path, engine: SamplingEngine, overrides: list[str]) -> Trainer:
    return Trainer(
        tiny_config(model_dir, out, overrides), engine=engine, reward_fn=digit_reward, train_data=sum_rows(8)
    )


def test_each_batch_is_sampled_with_the_weights_of_two_steps_before(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = WeightRecordingEngine(tiny_model_dir)
    trainer = trainer_for(tiny_model_dir, tmp_path / "run", engine, OFF_POLICY)
    actor = trainer.parts.actor
    assert isinstance(actor, PolicyActor)
    weights = [checksum(actor.model)]  # θ0, then θ1, θ2, θ3 after each step
    lags, recomputed = [], []

    trainer.weights.sync()  # what fit() does first
    try:
        for step in (1, 2, 3):
            trainer.step = step
            metrics = trainer.train_step()
            weights.append(checksum(actor.model))
            lags.append(metrics["rollout/policy_lag"])
            recomputed.append(metrics["actor/old_logprobs_from_update"])
        trainer.weights.refresh()
    finally:
        assert trainer.rollouts is not None
        trainer.rollouts.close()
    # step 1 trains on a batch of θ0 (generated then), step 2 on one of θ0 (generated during step 1), step 3 on θ1
    assert engine.sampled_with == pytest.approx([weights[0], weights[0], weights[1]], rel=1e-12)
    assert lags == [0.0, 1.0, 1.0]
    assert recomputed == [0.0, 0.0, 0.0]  # the ratio's old log-probs come from a fresh forward, never the update
    assert len(set(weights)) == 4  # every step moved the weights
    assert checksum(engine.model) == pytest.approx(weights[3], rel=1e-12)  # the engine ends current


def test_the_next_batch_is_generated_while_the_update_runs(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The second batch's generation waits until the first update has started: a trainer that generated and
    updated one after the other would never let it proceed (the wait times out and the test fails)."""
    update_started = threading.Event()
    overlapped: list[bool] = []

    class WaitsForTheUpdate(SamplingEngine):
        calls = 0

        def generate(self, requests: Any) -> Any:
            WaitsForTheUpdate.calls += 1
            if WaitsForTheUpdate.calls == 2:  # the batch started in the background during step 1
                overlapped.append(update_started.wait(timeout=60))
            return super().generate(requests)

    trainer = trainer_for(tiny_model_dir, tmp_path / "run", WaitsForTheUpdate(tiny_model_dir), OFF_POLICY)
    actor = trainer.parts.actor
    assert isinstance(actor, PolicyActor)
    update = actor.update_policy

    def update_and_signal(*args: Any, **kwargs: Any) -> Any:
        update_started.set()
        return update(*args, **kwargs)

    actor.update_policy = update_and_signal  # type: ignore[method-assign]
    trainer.fit()
    assert overlapped == [True]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len([line for line in lines if '"reward/mean"' in line]) == 3


def test_off_policy_refusals(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pass engine= a ready engine .* instead of a factory"):
        Trainer(
            tiny_config(tiny_model_dir, tmp_path / "run", OFF_POLICY),
            engine=lambda module: SamplingEngine(tiny_model_dir),
            reward_fn=digit_reward,
            train_data=sum_rows(8),
        )
    with pytest.raises(ConfigError, match="trainer.one_step_off_policy: cannot run with data.filter_solved"):
        load_config(None, ["model.path=/m", *OFF_POLICY, "data.filter_solved=true"])


def test_a_resume_trains_on_the_prompts_that_were_in_flight(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Checkpoint 1 is saved while step 2's batch is being generated; resuming from it must train step 2 on those
    same prompts (the loader position of the checkpoint excludes the batch in flight), not skip them."""

    def prompts(dump: Path, step: int) -> list[str]:
        records = [json.loads(line) for line in (dump / f"{step}.jsonl").read_text().splitlines()]
        return sorted({r["prompt"] for r in records})

    steps = [*OFF_POLICY, "trainer.save_every=1", "trainer.keep_last=3"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    trainer_for(
        tiny_model_dir, whole, SamplingEngine(tiny_model_dir), [*steps, f"trainer.rollout_data_dir={whole}/dump"]
    ).fit()
    trainer_for(
        tiny_model_dir,
        resumed,
        SamplingEngine(tiny_model_dir),
        [*steps, f"trainer.rollout_data_dir={resumed}/dump", f"trainer.resume={whole}/checkpoints/step_1"],
    ).fit()
    # 8 rows, 4 per step: steps 1-2 are epoch 0 (every row once), step 3 starts epoch 1
    assert set(prompts(whole / "dump", 1)).isdisjoint(prompts(whole / "dump", 2))
    for step in (2, 3):
        assert prompts(resumed / "dump", step) == prompts(whole / "dump", step)
