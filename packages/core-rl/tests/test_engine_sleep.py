"""The trainer drives an engine's sleep mode and sync labels where the engine has them (vLLM's): it sleeps for the
actor's update, takes its weights back before the push and its KV cache after, labels each push with its step, and
never generates asleep. An engine without them (HFEngine) is left alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config

from rlloom.core_rl.trainer import Trainer


class SleepyEngine(SamplingEngine):
    """The tiny sampling engine plus vLLM's optional methods, recording the order in which the trainer calls them."""

    def __init__(self, model_dir: str | Path) -> None:
        super().__init__(model_dir)
        self.events: list[str] = []
        self.asleep = False

    def generate(self, requests: Sequence[Any]) -> Any:
        assert not self.asleep, "generated while asleep"
        self.events.append("generate")
        return super().generate(requests)

    def update_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.events.append("update_weights")
        super().update_weights(weights)

    def sleep(self, level: int = 1) -> None:
        self.asleep = True
        self.events.append(f"sleep({level})")

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.events.append(f"wake_up({','.join(tags or [])})")
        if tags == ["kv_cache"]:
            self.asleep = False

    def begin_weight_sync(self, step: int) -> None:
        self.events.append(f"begin({step})")

    def finish_weight_sync(self) -> None:
        self.events.append("finish")


def test_the_trainer_sleeps_the_engine_for_each_update_and_wakes_it_around_the_push(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    engine = SleepyEngine(tiny_model_dir)
    trainer = Trainer(
        tiny_config(tiny_model_dir, tmp_path, ["trainer.total_steps=2", "trainer.val_every=0"]),
        engine=engine,
        reward_fn=digit_reward,
        train_data=sum_rows(8),
    )
    trainer.fit()
    push = ["begin({step})", "update_weights", "finish"]
    step = ["generate", "sleep(1)", "wake_up(weights)", *push, "wake_up(kv_cache)"]
    expected = [*push, *step, *step]  # fit's first sync, then two steps
    expected = [e.replace("{step}", str(s)) for e, s in zip(expected, [0] * 3 + [1] * 7 + [2] * 7, strict=True)]
    assert engine.events == expected
    assert not engine.asleep
