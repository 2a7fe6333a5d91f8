"""`trainer.mode=async` with the rollout engines on generator actors of their own (`distributed.rollout_placement:
separate`, issue 42), on a local Ray cluster: two steps of the tiny model with two HF generator actors.

Independent checks: generation ran in the actors' processes (pids other than this one, one per actor, each having
served requests); every trained token was sampled by weights no newer than the ones its step trains from and at
most max_staleness updates older (its `policy_versions`, labelled by the engines at each in-flight resume); and
after the last sync each generator holds exactly the actor's weights (one tensor compared, which training moved
away from the start).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import digit_reward, sum_rows, tiny_config

from rlloom.core_rl.contracts.engines import InflightWeightUpdate
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

ray = pytest.importorskip("ray")
hf = pytest.importorskip("rlloom.rollout.hf.engine")

from rlloom.core_rl.distributed.generators import GeneratorEngines  # noqa: E402
from rlloom.core_rl.distributed.ray_start import start_ray  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.ray]
ETA = 1
CHECKED = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    # the engine factory and the weight probe travel to the actors by value: this file is not importable there
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    start_ray(None, num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


class HFReplica:
    """The Trainer's `engine=` factory: an `HFEngine` on the copy of the policy each generator actor loads."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = str(model_dir)

    def __call__(self, module: torch.nn.Module) -> Any:
        return hf.HFEngine(module, load_pretrained_tokenizer(self.model_dir))


def _weight(engine: Any) -> torch.Tensor:
    return engine.model.get_parameter(CHECKED).detach().clone()


def test_async_training_with_two_generator_actors(tiny_model_dir: Path, tmp_path: Path) -> None:
    overrides = [
        "trainer.mode=async",
        f"trainer.streaming.max_staleness={ETA}",
        "trainer.total_steps=2",
        "trainer.save_every=0",
        "actor.warmup_steps=0",
        "distributed.rollout_placement=separate",
        "distributed.rollout_replicas=2",
    ]
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", overrides)
    trainer = Trainer(cfg, engine=HFReplica(tiny_model_dir), reward_fn=digit_reward, train_data=sum_rows(8))
    engine = trainer.engine
    assert isinstance(engine, GeneratorEngines) and isinstance(engine, InflightWeightUpdate)
    trained: list[tuple[int, list[list[int]]]] = []  # (step, each trained trajectory's token versions)
    rollouts = trainer.rollouts
    assert rollouts is not None
    take = rollouts.next_batch

    def recording_take(step: int, **kwargs: Any) -> Any:
        batch = take(step, **kwargs)
        trained.append((step, [list(t.policy_versions or []) for t in batch.trajectories]))
        return batch

    rollouts.next_batch = recording_take  # type: ignore[method-assign]
    try:
        trainer.fit()
        info = engine.replica_info()
        held = engine.on_replicas(_weight)
    finally:
        engine.close()

    pids = [int(i["pid"]) for i in info]
    assert os.getpid() not in pids and len(set(pids)) == 2  # two processes of their own
    assert all(int(i["requests"]) > 0 for i in info)  # both generated
    assert [step for step, _ in trained] == [1, 2]
    for step, versions in trained:
        trains_from = step - 1  # step t trains the weights of t - 1 updates
        assert versions and all(len(v) > 0 for v in versions)
        assert max(max(v) for v in versions) <= trains_from
        assert trains_from - min(min(v) for v in versions) <= ETA
    actor_weight = dict(trainer.parts.actor.named_weights())[CHECKED]
    start = load_file(str(tiny_model_dir / "model.safetensors"))[CHECKED]
    assert not torch.equal(actor_weight, start)  # training moved it, so the comparison below is not vacuous
    for weight in held:
        assert torch.equal(weight, actor_weight.to(weight.dtype))
