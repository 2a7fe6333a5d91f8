"""veRL's between-phase offload (`distributed.param_offload` / `optimizer_offload`) on 2 gloo ranks under Ray.

On CPU ranks the compute device is the CPU, so "offloaded" is read from the live storages instead: while the state
is away its device storages hold 0 bytes (the bytes sit in a host copy). The driver's engine asks the ranks where
the actor's and reference's state is each time the trainer has it generate: with offload it must be away (0 bytes)
at every generation, without offload there. A forward on state that is away raises (the offload's guard), so a
2-step run that completes proves every forward and update had its state back; and training must be bit for bit
the one without offload (metrics other than timings, and the final weights).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from test_trainer_engine_factory import SharedModuleEngine
from tiny_run import digit_reward, sum_rows, tiny_config

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

ray = pytest.importorskip("ray")
from rlloom.core_rl.distributed.ray_group import RayActorGroup  # noqa: E402
from rlloom.core_rl.distributed.ray_start import start_ray  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(600)]

RUN = ["trainer.total_steps=2", "trainer.save_every=0", "data.train_batch_size=2", "rollout.n=2",
       "actor.mini_batch_size=2", "actor.ppo_epochs=1", "actor.warmup_steps=0", "trainer.val_every=0"]  # fmt: skip
TWO_RANKS = ["distributed.num_ranks=2", "distributed.cpus_per_rank=0.5", "distributed.timeout_s=120",
             "distributed.rollout_on_ranks=false"]  # fmt: skip
OFFLOAD = ["distributed.param_offload=true", "distributed.optimizer_offload=true"]


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    start_ray(None, num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


class PlacementProbe(SharedModuleEngine):
    """The driver's engine: before each generation it asks every rank where the actor's and the reference's
    state is (bytes on the device, from the live storages)."""

    group: RayActorGroup | None = None

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seen: list[dict[str, list[dict[str, int]]]] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        assert self.group is not None
        self.seen.append({role: self.group.each("placement", role) for role in ("actor", "reference")})
        return super().generate(requests)


def train(model_dir: Path, out: Path, extra: Sequence[str]) -> tuple[list[dict[str, Any]], PlacementProbe, Any]:
    """A 2-step GRPO run (with a KL loss, so the reference lives on the ranks too); its metrics, its engine, and
    the final weights (gathered at rank 0), then the placement after the run."""
    tokenizer = load_pretrained_tokenizer(model_dir)
    probes: list[PlacementProbe] = []

    def factory(module: torch.nn.Module) -> PlacementProbe:
        probes.append(PlacementProbe(module, tokenizer))
        return probes[-1]

    trainer = Trainer(
        tiny_config(model_dir, out, [*RUN, *TWO_RANKS, *extra]),
        engine=factory,
        reward_fn=digit_reward,
        train_data=sum_rows(4),
    )
    group = trainer.parts.actor
    assert isinstance(group, RayActorGroup) and len(probes) == 1
    probes[0].group = group
    try:
        trainer.fit()
        weights = dict(group.named_weights())
        after = group.each("placement", "actor")
        group.each("hold", "actor")  # back on the device, as for a bucketed weight sync
        held = group.each("placement", "actor")
        group.each("release", "actor")
        released = group.each("placement", "actor")
    finally:
        group.close()
    volatile = ("timing/", "perf/")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    metrics = [{k: v for k, v in json.loads(line).items() if not k.startswith(volatile)} for line in lines]
    return metrics, probes[0], {"weights": weights, "after": after, "held": held, "released": released}


def test_offloaded_state_is_away_while_generating_and_training_is_bitwise_the_same(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    plain_metrics, plain, plain_end = train(tiny_model_dir, tmp_path / "plain", [])
    off_metrics, off, off_end = train(tiny_model_dir, tmp_path / "offload", OFFLOAD)

    assert len(off.seen) == len(plain.seen) >= 2  # one generation a step
    for seen in plain.seen:  # without offload: the state stays on the device
        assert all(rank["parameters"] > 0 for rank in seen["actor"] + seen["reference"])
    assert all(rank["optimizer"] > 0 for rank in plain.seen[-1]["actor"])  # AdamW's moments after step 1
    for seen in off.seen:  # with it: nothing of either model on the device while the engine generates
        assert seen == {role: [{"parameters": 0, "optimizer": 0}] * 2 for role in ("actor", "reference")}
    assert off_end["after"] == [{"parameters": 0, "optimizer": 0}] * 2
    # reloaded, the parameter shards take exactly their room again; released, they go
    assert [r["parameters"] for r in off_end["held"]] == [r["parameters"] for r in plain_end["after"]]
    assert off_end["released"] == [{"parameters": 0, "optimizer": 0}] * 2

    assert [m["step"] for m in off_metrics] == [1, 2]
    assert off_metrics[-1]["actor/kl_loss"] > 0  # the policy moved away from the reference
    assert off_metrics == plain_metrics  # bit for bit
    assert off_end["weights"].keys() == plain_end["weights"].keys()
    for name, value in plain_end["weights"].items():
        assert torch.equal(off_end["weights"][name], value), name
