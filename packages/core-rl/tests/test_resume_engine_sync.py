"""A resumed run with an engine of its own weights (`engine=`: vLLM on `model.path`, here the tests' HF
`SamplingEngine`, loaded the same way) samples its first batch from the checkpoint's weights, not the start
weights the engine loaded (issue 30): `fit()` pushes the actor's weights before the first rollout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config
from transformers import AutoModelForCausalLM

from rlloom.core_rl.trainer import Trainer


def checksum(module: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in module.parameters()))


class RecordingEngine(SamplingEngine):
    """Notes the checksum of the weights each generate call samples with."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__(model_dir)
        self.sampled_with: list[float] = []

    def generate(self, requests: Any) -> Any:
        self.sampled_with.append(checksum(self.model))
        return super().generate(requests)


def test_a_resumed_run_samples_from_the_checkpoint_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    overrides = ["actor.warmup_steps=0", "actor.lr=1e-2", "trainer.save_every=1", "trainer.val_every=0"]

    def fit(total_steps: int) -> RecordingEngine:
        engine = RecordingEngine(tiny_model_dir)
        cfg = tiny_config(tiny_model_dir, out, [*overrides, f"trainer.total_steps={total_steps}"])
        Trainer(cfg, engine=engine, reward_fn=digit_reward, train_data=sum_rows(8)).fit()
        return engine

    fit(1)
    start = checksum(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    saved = checksum(AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step_1"))
    assert abs(saved - start) > 1e-3  # the step moved the weights
    resumed = fit(2)  # resumes after step 1, with an engine holding model.path's weights
    assert resumed.sampled_with, "the resumed step generated nothing"
    assert abs(resumed.sampled_with[0] - saved) < 1e-6 * max(1.0, abs(saved))
