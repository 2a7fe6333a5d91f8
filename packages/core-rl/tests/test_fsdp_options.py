"""FSDP2 options on 2 gloo ranks: CPU offload and hybrid sharding change where shards live, never the numbers.

Two processes (torch.multiprocessing, no Ray) run the sharded actor's real update on the same batch with each
layout: plain FSDP over both ranks, with `CPUOffloadPolicy`, and a (2, 1) hybrid mesh (pure replication: every rank
holds everything and gradients are all-reduced). All must end at the plain layout's weights
(1e-6), which must equal an in-process actor's (the independent expectation); each rank reports the mesh and the
offload policy FSDP2 recorded on its modules.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import spawn_ranks
from test_workers import random_batch

from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.schema import ConfigError, RLConfig
from rlloom.core_rl.distributed.fsdp import MESH_DIMS, fsdp_mesh, full_model_state, shard_model
from rlloom.core_rl.distributed.ranks import RankContext, ShardedPolicyActor
from rlloom.core_rl.workers.actor import PolicyActor, load_causal_lm
from rlloom.core_rl.workers.settings import actor_settings

pytestmark = [pytest.mark.slow]

CPU = torch.device("cpu")
WORLD = 2
LAYOUTS = {  # name: (shard_size, cpu_offload)
    "fsdp": (None, False),
    "fsdp_offload": (None, True),
    "replicate": (1, False),
}


def run_config(model_dir: Path) -> RLConfig:
    return RLConfig.model_validate(
        {
            "model": {"path": str(model_dir)},
            "rollout": {"n": 1, "max_tokens": 9},
            "algorithm": {"adv_estimator": "reinforce_plus_plus"},
            "actor": {"lr": 1e-4, "ppo_epochs": 1, "mini_batch_size": 7, "warmup_steps": 0, "shuffle": False},
            "distributed": {"num_ranks": WORLD},
        }
    )


def offload_policy_name(model: torch.nn.Module) -> str:
    """The offload policy FSDP2 holds for the root unit (its param group's; private, so read defensively)."""
    state = model._get_fsdp_state()  # type: ignore[operator]
    group = state._fsdp_param_group
    return type(group.offload_policy).__name__


def rank_main(rank: int, port: int, model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        cfg = run_config(Path(model_dir))
        ctx = RankContext(rank, WORLD, CPU)
        report: dict[str, Any] = {}
        for name, (shard_size, offload) in LAYOUTS.items():
            model = load_causal_lm(cfg.model, model_dir, CPU)
            mesh = fsdp_mesh(WORLD, shard_size, "cpu")
            shard_model(model, mesh=mesh, cpu_offload=offload)
            actor = ShardedPolicyActor(model, ctx, **actor_settings(cfg, 10, CPU))
            actor.update_policy(random_batch(model.config.vocab_size))
            weight = model.get_input_embeddings().weight
            report[name] = {
                "mesh": tuple(weight.device_mesh.shape),
                "mesh_dims": weight.device_mesh.mesh_dim_names,
                "local_rows": weight.to_local().shape[0],
                "offload": offload_policy_name(model),
                "weights": full_model_state(model),
            }
        torch.save(report, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(300)
def test_offload_and_hybrid_sharding_train_like_plain_fsdp(tiny_model_dir: Path, tmp_path: Path) -> None:
    spawn_ranks(__file__, "rank_main", (free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    vocab = ranks[0]["fsdp"]["weights"]["model.embed_tokens.weight"].shape[0]
    for report in ranks:
        assert report["fsdp"]["mesh"] == (2,) and report["fsdp"]["local_rows"] == vocab // 2
        assert report["replicate"]["mesh"] == (2, 1) and report["replicate"]["mesh_dims"] == MESH_DIMS
        assert report["replicate"]["local_rows"] == vocab  # replicated: each rank holds the whole tensor
        for name, (_, offload) in LAYOUTS.items():
            assert report[name]["offload"] == ("CPUOffloadPolicy" if offload else "OffloadPolicy"), name

    cfg = run_config(tiny_model_dir)  # the expectation: one process, the whole batch
    single = PolicyActor(load_causal_lm(cfg.model, str(tiny_model_dir), CPU), **actor_settings(cfg, 10, CPU))
    start = {k: v.clone() for k, v in single.model.state_dict().items()}
    single.update_policy(random_batch(single.model.config.vocab_size))
    expected = single.model.state_dict()
    plain = ranks[0]["fsdp"]["weights"]
    assert any(not torch.equal(plain[k], start[k]) for k in start)  # the step moved the weights
    for key in expected:
        torch.testing.assert_close(plain[key], expected[key], rtol=0, atol=1e-6)
    for name in LAYOUTS:
        got = ranks[0][name]["weights"]
        assert got.keys() == plain.keys(), name
        for key in plain:
            torch.testing.assert_close(got[key], plain[key], rtol=0, atol=1e-6, msg=f"{name}: {key}")


def test_shard_size_must_divide_the_ranks() -> None:
    with pytest.raises(ValueError, match=r"shard_size=3 does not divide the 4 ranks"):
        fsdp_mesh(4, 3, "cpu")
    assert fsdp_mesh(4, 4, "cpu") is None and fsdp_mesh(4, None, "cpu") is None  # one group: the flat mesh
    with pytest.raises(ValueError, match=r"3 does not divide distributed.num_ranks=4: shard groups"):
        RLConfig.model_validate({"model": {"path": "m"}, "distributed": {"num_ranks": 4, "shard_size": 3}})
    with pytest.raises(ValueError, match=r"num_ranks is 1: in-process training does not use FSDP2"):
        RLConfig.model_validate({"model": {"path": "m"}, "distributed": {"cpu_offload": True}})


def test_verl_fsdp_keys_set_ours_or_name_the_fix() -> None:
    cfg = load_config(
        None,
        [
            "model.path=/m",
            "distributed.num_ranks=4",
            "actor_rollout_ref.actor.fsdp_config.offload_policy=true",
            "actor_rollout_ref.actor.fsdp_config.fsdp_size=2",
            "actor_rollout_ref.actor.fsdp_config.param_offload=false",  # veRL's default
            "actor_rollout_ref.model.override_config.attn_implementation=eager",
            "actor_rollout_ref.model.use_remove_padding=true",
        ],
    )
    assert (cfg.distributed.cpu_offload, cfg.distributed.shard_size) == (True, 2)
    assert (cfg.model.attn_implementation, cfg.actor.padding_free) == ("eager", True)
    everyone = load_config(None, ["model.path=/m", "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1"])
    assert everyone.distributed.shard_size is None
    assert not (cfg.distributed.param_offload or cfg.distributed.optimizer_offload)
    between = ["model.path=/m", "distributed.num_ranks=2", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
               "actor_rollout_ref.ref.fsdp_config.param_offload=True"]  # fmt: skip
    phases = load_config(None, between).distributed  # veRL's between-phase offload (test_fsdp_offload.py)
    assert (phases.param_offload, phases.optimizer_offload, phases.cpu_offload) == (True, True, False)
    with pytest.raises(ConfigError, match=r"distributed.optimizer_offload.*num_ranks is 1.*num_ranks > 1"):
        load_config(None, ["model.path=/m", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True"])
    with pytest.raises(ConfigError, match=r"distributed.param_offload.*together with distributed.cpu_offload"):
        load_config(None, [*between, "actor_rollout_ref.actor.fsdp_config.offload_policy=true"])


def test_a_vision_tower_on_a_torch_without_unused_param_reduction_is_refused_before_sharding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch 2.11 (seen on the lent H100) has no `FSDPModule.set_reduce_scatter_unused_params`. Text-only models
    never need it; a model with a vision tower would hang when ranks differ in images, so it is refused by name
    before any module is sharded (no process group is needed to see that)."""
    from torch.distributed.fsdp import FSDPModule

    from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2

    class WithTower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.language_model = tiny_qwen2(char_tokenizer())
            self.visual = torch.nn.Linear(4, 4)
            self._no_split_modules = self.language_model._no_split_modules

    monkeypatch.delattr(FSDPModule, "set_reduce_scatter_unused_params", raising=False)
    model = WithTower()
    with pytest.raises(ValueError, match=r"vision tower.*set_reduce_scatter_unused_params.*install a torch"):
        shard_model(model)
    assert not any(isinstance(module, FSDPModule) for module in model.modules())
