"""Sharded checkpoints (DCP): 2 gloo ranks each write their shard; 3 ranks, and one process, read them back.

The independent expectation is the 2-rank run itself: its weights and AdamW moments gathered to full size by
FSDP2 (`full_tensor`, a path DCP does not use), and the metrics of the update it ran after the save. A resumed
worker must hold exactly the saved tensors and repeat that update. The HF export is checked against transformers:
`from_pretrained` of the exported folder gives the logits of the saved weights, with the tied head stored once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from safetensors import safe_open
from spawn_ranks import spawn_ranks
from test_distributed import assert_metrics_close, in_process_actor, worker_config
from test_fsdp_options import WORLD, free_port, run_config
from test_workers import random_batch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from transformers import AutoModelForCausalLM

from rlloom.core_rl.cli.main import main as cli
from rlloom.core_rl.distributed.fsdp import fsdp_mesh, full_model_state, shard_model
from rlloom.core_rl.distributed.ranks import RankContext, ShardedPolicyActor
from rlloom.core_rl.run.sharded_checkpoint import (
    is_sharded,
    load_worker_state,
    resolved,
    save_worker_shards,
    shard_bytes,
    shard_state,
    shards_path,
)
from rlloom.core_rl.workers.actor import PolicyActor, load_causal_lm
from rlloom.core_rl.workers.settings import actor_settings
from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

ray = pytest.importorskip("ray")
from rlloom.core_rl.distributed.ray_group import RayActorGroup  # noqa: E402
from rlloom.core_rl.distributed.ray_start import start_ray  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow, pytest.mark.ray]
CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    start_ray(None, num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def assert_same_optimizer(got: dict, expected: dict) -> None:
    assert got["state"].keys() == expected["state"].keys()
    for index, moments in expected["state"].items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(got["state"][index][key], moments[key]), (index, key)


def test_two_rank_shards_resume_on_three_ranks_and_one_process_and_export(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg2 = worker_config(tiny_model_dir, ranks=2)
    batch = random_batch(AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size)
    two = RayActorGroup(cfg2, total_steps=10, weights_path=str(tiny_model_dir), with_reference=False)
    logprobs, _ = two.compute_logprobs(batch, temperature=0.8)
    batch["old_logprobs"] = logprobs - 0.05 * batch.loss_mask  # off-policy enough that some ratios clip
    two.update_policy(batch, temperature=0.8)  # two epochs of 3 mini-batches: AdamW moments and step counts
    step = tmp_path / "step_1"
    two.save_shards(str(shards_path(step, "actor")))
    entry = two.shard_state()
    saved_weights = dict(two.named_weights())
    saved_optimizer = two.state_dict()["optimizer"]
    continued = two.update_policy(batch, temperature=0.8)  # the uninterrupted run's next update
    two.close()

    # each rank wrote its own half: weights + two AdamW moments, the tied embedding once
    assert is_sharded(step) and "optimizer" not in entry and entry["shards"] == "sharded/actor"
    files = shard_bytes(shards_path(step, "actor"))
    per_rank = [files["__0_0.distcp"], files["__1_0.distcp"]]
    params = list(AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())  # the tied one once
    numel = sum(p.numel() for p in params)
    # fp32 weights, exp_avg and exp_avg_sq, and a float step per parameter; nothing else, nothing twice
    metadata = FileSystemReader(shards_path(step, "actor")).read_metadata().state_dict_metadata
    stored = sum(m.size.numel() * m.properties.dtype.itemsize for m in metadata.values() if hasattr(m, "size"))
    assert stored == 3 * 4 * numel + 4 * len(params)
    assert stored <= sum(per_rank) <= stored * 1.4  # DCP writes each piece as a small record (~1.5 KB here)
    assert max(per_rank) <= sum(per_rank) * 0.6

    # resumed on 3 ranks from the base model + the shards (DCP reshards 2 -> 3): the saved tensors, bit for bit
    three = RayActorGroup(worker_config(tiny_model_dir, ranks=3), total_steps=10,
                          weights_path=str(tiny_model_dir), with_reference=False)  # fmt: skip
    three.load_state_dict(resolved(entry, step))
    got = dict(three.named_weights())
    assert got.keys() == saved_weights.keys()
    assert all(torch.equal(got[name], value) for name, value in saved_weights.items())
    assert_same_optimizer(three.state_dict()["optimizer"], saved_optimizer)
    assert_metrics_close(three.update_policy(batch, temperature=0.8), continued)
    three.close()

    # ... and in one process (no process group)
    one = in_process_actor(cfg2, tiny_model_dir)
    load_worker_state(one, entry, step)
    assert all(torch.equal(one.model.state_dict()[name], value) for name, value in saved_weights.items())
    assert_same_optimizer(one.optimizer.state_dict(), saved_optimizer)
    assert_metrics_close(one.update_policy(batch, temperature=0.8), continued)

    # HF export: from_pretrained loads it and gives the saved weights' logits; the tied head is stored once
    load_pretrained_tokenizer(tiny_model_dir).save_pretrained(step)  # the trainer writes the run's tokenizer there
    cli(["export-hf", str(step), str(tmp_path / "hf")])
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    expected = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    expected.load_state_dict(saved_weights)
    ids = batch["input_ids"][:2]
    torch.testing.assert_close(exported(ids).logits, expected(ids).logits, rtol=0, atol=0)
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as stored:
        names = set(stored.keys())
    assert exported.config.tie_word_embeddings and "lm_head.weight" not in names
    assert "model.embed_tokens.weight" in names


def test_export_refuses_a_checkpoint_of_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as raised:
        cli(["export-hf", str(tiny_model_dir), str(tmp_path / "hf")])
    assert raised.value.code == 2


def layout_rank(rank: int, port: int, model_dir: str, out: str) -> None:
    """One rank: train with CPU offload, and on a (2, 1) hybrid mesh (replicas, so DCP must write each piece
    once), save each layout's shards, and record the gathered weights and moments as the expectation."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        cfg = run_config(Path(model_dir))
        expected: dict[str, Any] = {}
        for name, (shard_size, offload) in {"offload": (None, True), "replicate": (1, False)}.items():
            model = load_causal_lm(cfg.model, model_dir, CPU)
            shard_model(model, mesh=fsdp_mesh(WORLD, shard_size, "cpu"), cpu_offload=offload)
            actor = ShardedPolicyActor(model, RankContext(rank, WORLD, CPU), **actor_settings(cfg, 10, CPU))
            actor.update_policy(random_batch(model.config.vocab_size))
            save_worker_shards(actor, Path(out) / name / "sharded" / "actor")
            expected[name] = {"entry": shard_state(actor, "actor"), "weights": full_model_state(model),
                              "optimizer": actor.state_dict()["optimizer"]}  # fmt: skip
        if rank == 0:
            torch.save(expected, Path(out) / "expected.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
def test_offloaded_and_hybrid_shards_load_in_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    spawn_ranks(__file__, "layout_rank", (free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=WORLD)
    expected = torch.load(tmp_path / "expected.pt", weights_only=False)
    cfg = run_config(tiny_model_dir)
    written = {name: sum(shard_bytes(tmp_path / name / "sharded" / "actor").values()) for name in expected}
    assert written["replicate"] <= written["offload"] * 1.1  # both ranks hold every tensor: each is written once
    for name, saved in expected.items():
        one = PolicyActor(load_causal_lm(cfg.model, str(tiny_model_dir), CPU), **actor_settings(cfg, 10, CPU))
        load_worker_state(one, saved["entry"], tmp_path / name)
        state = one.model.state_dict()
        assert all(torch.equal(state[key], value) for key, value in saved["weights"].items()), name
        assert_same_optimizer(one.optimizer.state_dict(), saved["optimizer"])


def test_a_sharded_checkpoint_given_as_hf_weights_is_refused_in_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    step = tmp_path / "step_3"
    (shards_path(step, "actor")).mkdir(parents=True)
    (shards_path(step, "actor") / ".metadata").write_bytes(b"")
    cfg = run_config(tiny_model_dir)
    with pytest.raises(ValueError, match=rf"model weights {step} is a checkpoint written by ranks .*export-hf {step}"):
        load_causal_lm(cfg.model, str(step), CPU)
