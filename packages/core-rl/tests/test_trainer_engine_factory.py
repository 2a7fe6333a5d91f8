"""`Trainer(engine=factory)`: a rollout engine built on the actor's own module, with no weight copy.

The independent expectation: sampling from the shared module must train exactly like sampling from a separate
copy that is synced every step (a ready engine as `engine=`), so two seeded, deterministic runs give the same rewards
and the same final weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.actor import PolicyActor
from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

OVERRIDES = ["trainer.total_steps=2", "trainer.save_every=0"]


class SharedModuleEngine(SamplingEngine):
    """tiny_run's engine, sampling from a module it is handed instead of loading its own copy."""

    def __init__(self, module: nn.Module, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.model = module
        self.weight_updates = 0


def _rewards(out: Path) -> list[float]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [line["reward/mean"] for line in lines if "reward/mean" in line]


def test_engine_on_the_actor_module_trains_like_a_synced_copy(tiny_model_dir: Path, tmp_path: Path) -> None:
    tokenizer = load_pretrained_tokenizer(tiny_model_dir)
    modules: list[nn.Module] = []

    def factory(module: nn.Module) -> SharedModuleEngine:
        modules.append(module)
        return SharedModuleEngine(module, tokenizer)

    shared = Trainer(
        tiny_config(tiny_model_dir, tmp_path / "shared", OVERRIDES),
        engine=factory,
        reward_fn=digit_reward,
        train_data=sum_rows(8),
    )
    actor = shared.parts.actor
    assert isinstance(actor, PolicyActor)
    assert len(modules) == 1 and modules[0] is actor.model  # built once, on the actor's module itself
    assert isinstance(shared.engine, SharedModuleEngine) and shared.engine.model is actor.model
    shared.fit()

    copied = Trainer(
        tiny_config(tiny_model_dir, tmp_path / "copied", OVERRIDES),
        engine=SamplingEngine(tiny_model_dir),
        reward_fn=digit_reward,
        train_data=sum_rows(8),
    )
    copied.fit()

    assert _rewards(tmp_path / "shared") == _rewards(tmp_path / "copied")
    assert len(_rewards(tmp_path / "shared")) == 2
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    copied_actor = copied.parts.actor
    assert isinstance(copied_actor, PolicyActor)
    trained = copied_actor.model.state_dict()
    moved = 0
    for name, tensor in actor.model.state_dict().items():
        torch.testing.assert_close(tensor, trained[name], rtol=0, atol=1e-6)
        moved += int(not torch.equal(tensor, start[name]))
    assert moved, "two GRPO steps left every weight where it started"


def test_engine_and_factory_are_exclusive(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = tiny_config(tiny_model_dir, tmp_path / "x", OVERRIDES)
    with pytest.raises(ValueError, match="exactly one of engine="):
        Trainer(config, reward_fn=digit_reward, train_data=sum_rows(4))
    with pytest.raises(ValueError, match="exactly one of engine="):
        Trainer(
            config,
            engine=SamplingEngine(tiny_model_dir),
            engine_factory=lambda module: SamplingEngine(tiny_model_dir),
            reward_fn=digit_reward,
            train_data=sum_rows(4),
        )


def test_factory_must_return_a_rollout_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = tiny_config(tiny_model_dir, tmp_path / "y", OVERRIDES)
    with pytest.raises(TypeError, match="factory returned a Linear"):
        Trainer(config, engine=lambda module: nn.Linear(1, 1), reward_fn=digit_reward, train_data=sum_rows(4))
    with pytest.raises(TypeError, match="engine= is a int: give a RolloutEngine"):
        Trainer(config, engine=7, reward_fn=digit_reward, train_data=sum_rows(4))  # type: ignore[arg-type]


def test_the_former_engine_factory_keyword_still_builds_on_the_module_with_a_warning(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tokenizer = load_pretrained_tokenizer(tiny_model_dir)
    config = tiny_config(tiny_model_dir, tmp_path / "z", OVERRIDES)
    with pytest.warns(DeprecationWarning, match=r"pass the factory as engine=") as caught:
        trainer = Trainer(
            config,
            engine_factory=lambda module: SharedModuleEngine(module, tokenizer),
            reward_fn=digit_reward,
            train_data=sum_rows(4),
        )
    assert caught[0].filename == __file__  # the warning points at the caller's line
    actor = trainer.parts.actor
    assert isinstance(actor, PolicyActor) and isinstance(trainer.engine, SharedModuleEngine)
    assert trainer.engine.model is actor.model
