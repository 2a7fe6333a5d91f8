"""The actor and reference as FSDP2 shards on Ray ranks (gloo on CPU), checked against the in-process workers.

The single-process `PolicyActor` is the independent expectation: with a batch that does not divide the ranks
(7 rows on 3 ranks, mini-batches of 3 + 3 + 1 rows, so two ranks run weight-0 filler forwards), log-probs,
update metrics, weights and optimizer state must match it up to float summation order. Checkpoints hold
full-size state, so a run resumes on another number of ranks (or in one process) and continues the same run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_trainer_engine_factory import SharedModuleEngine
from test_workers import random_batch
from tiny_run import SamplingEngine, digit_reward, run, sum_rows, tiny_config
from transformers import AutoModelForCausalLM

from rlloom.core_rl.cli.main import main as export_cli
from rlloom.core_rl.config.schema import RLConfig
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.actor import PolicyActor, load_causal_lm
from rlloom.core_rl.workers.critic import ValueCritic, ValueModel
from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

ray = pytest.importorskip("ray")
from rlloom.core_rl.distributed.ray_group import RayActorGroup  # noqa: E402
from rlloom.core_rl.distributed.ray_start import start_ray  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow, pytest.mark.ray]
CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    start_ray(None, num_cpus=2, include_dashboard=False, log_to_driver=False)  # retried once on a busy machine
    yield
    ray.shutdown()


def worker_config(model_dir: Path, ranks: int) -> RLConfig:
    return RLConfig.model_validate(
        {
            "model": {"path": str(model_dir)},
            "rollout": {"n": 1, "max_tokens": 9},
            # one sample per prompt: an estimator without groups (the config refuses GRPO with rollout.n=1)
            "algorithm": {"adv_estimator": "reinforce_plus_plus", "entropy": {"coef": 0.01},
                          "loss_agg_mode": "seq-mean-token-mean", "clip_high": 0.28},
            "actor": {"lr": 1e-3, "ppo_epochs": 2, "mini_batch_size": 3, "max_tokens_per_micro_batch": 20,
                      "grad_clip": 0.5},
            "critic": {"lr": 1e-3, "ppo_epochs": 2, "mini_batch_size": 3, "max_tokens_per_micro_batch": 20},
            "trainer": {"device": "cpu", "seed": 0},
            "distributed": {"num_ranks": ranks, "cpus_per_rank": 0.5, "timeout_s": 300},
        }
    )  # fmt: skip


def in_process_actor(cfg: RLConfig, weights: Path) -> PolicyActor:
    return PolicyActor(
        load_causal_lm(cfg.model, str(weights), CPU),
        actor=cfg.actor,
        algorithm=cfg.algorithm,
        total_steps=10,
        mini_batch_rows=cfg.actor.mini_batch_size,
        max_response_length=cfg.rollout.max_tokens,
        device=CPU,
    )


def assert_metrics_close(got: dict[str, float], expected: dict[str, float]) -> None:
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


def assert_weights_close(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, value in expected.items():  # Adam amplifies summation-order rounding of tiny gradients (test_workers)
        torch.testing.assert_close(got[name], value, rtol=1e-4, atol=2e-5)


@pytest.mark.timeout(1200)  # six groups of ranks; took 600 s at load average 20 on 2 cores
def test_sharded_workers_match_the_in_process_ones_and_resume_on_other_rank_counts(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg3 = worker_config(tiny_model_dir, ranks=3)
    group = RayActorGroup(cfg3, total_steps=10, weights_path=str(tiny_model_dir), with_reference=True)
    single = in_process_actor(cfg3, tiny_model_dir)
    batch = random_batch(single.model.config.vocab_size)
    assert batch.batch_size % 3 != 0

    expected_lp, expected_ent = single.compute_logprobs(batch, temperature=0.8, entropy=True)
    got_lp, got_ent = group.compute_logprobs(batch, temperature=0.8, entropy=True)
    assert got_ent is not None and expected_ent is not None
    torch.testing.assert_close(got_lp, expected_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_ent, expected_ent, rtol=1e-5, atol=1e-5)
    assert group.reference is not None
    ref_lp, _ = group.reference.compute_logprobs(batch, temperature=0.8)
    torch.testing.assert_close(ref_lp, expected_lp, rtol=1e-5, atol=1e-5)  # nothing trained yet

    batch["old_logprobs"] = expected_lp - 0.05 * batch.loss_mask  # off-policy enough that some ratios clip
    expected_metrics = single.update_policy(batch, temperature=0.8)
    got_metrics = group.update_policy(batch, temperature=0.8)
    assert expected_metrics["actor/pg_clipfrac"] > 0 and expected_metrics["actor/grad_norm"] > 0.5  # clipping ran
    assert_metrics_close(got_metrics, expected_metrics)
    assert_weights_close(dict(group.named_weights()), dict(single.model.state_dict()))
    # weight sync a bucket at a time: every tensor exactly once, each bucket within budget unless one tensor is
    # larger than the budget by itself
    budget = 4096
    buckets = list(group.iter_weight_buckets(budget))
    assert len(buckets) > 3
    for bucket in buckets:
        assert len(bucket) == 1 or sum(t.numel() * t.element_size() for t in bucket.values()) <= budget
    assert sum(len(b) for b in buckets) == len(single.model.state_dict())
    assert_weights_close({k: v for b in buckets for k, v in b.items()}, dict(single.model.state_dict()))

    # the reference stayed frozen while the policy moved
    moved_lp, _ = group.compute_logprobs(batch, temperature=0.8)
    still_lp, _ = group.reference.compute_logprobs(batch, temperature=0.8)
    assert (moved_lp - expected_lp).abs().max() > 1e-3
    torch.testing.assert_close(still_lp, expected_lp, rtol=1e-5, atol=1e-5)

    # each rank keeps about a third of the parameters and AdamW moments (FSDP2 pads uneven shards by < 1 row)
    kept = group.call("actor", "state_bytes")
    whole = single.state_bytes()
    for key in ("parameters", "optimizer"):
        assert whole[key] <= sum(rank[key] for rank in kept) <= whole[key] * 1.05
        assert max(rank[key] for rank in kept) <= whole[key] / 3 * 1.1

    # checkpoint on 3 ranks: full-size optimizer state in the single-process layout, HF weights
    state = group.state_dict()
    single_state = single.state_dict()
    assert state["optimizer"]["state"].keys() == single_state["optimizer"]["state"].keys()
    for index, moments in single_state["optimizer"]["state"].items():
        torch.testing.assert_close(state["optimizer"]["state"][index]["exp_avg"], moments["exp_avg"],
                                   rtol=1e-4, atol=1e-6)  # fmt: skip
    saved = tmp_path / "three_ranks"
    group.save_pretrained(str(saved))
    reloaded = AutoModelForCausalLM.from_pretrained(saved)
    assert_weights_close(dict(reloaded.state_dict()), dict(single.model.state_dict()))
    group.close()

    # ... resumed on 2 ranks, and in one process, both continue the uninterrupted run
    expected_metrics = single.update_policy(batch, temperature=0.8)
    two = RayActorGroup(worker_config(tiny_model_dir, ranks=2), total_steps=10, weights_path=str(saved),
                        with_reference=False)  # fmt: skip
    two.load_state_dict(state)
    assert_metrics_close(two.update_policy(batch, temperature=0.8), expected_metrics)
    assert_weights_close(dict(two.named_weights()), dict(single.model.state_dict()))
    one = in_process_actor(cfg3, saved)
    one.load_state_dict(state)
    assert_metrics_close(one.update_policy(batch, temperature=0.8), expected_metrics)

    # a rank that fails while its peers wait in a collective ends the call at once (not after timeout_s=300 s):
    # row 0's token id is past the vocabulary, so only the rank that owns row 0 raises, in its embedding lookup
    bad = batch.select(list(range(batch.batch_size)))
    bad["input_ids"] = bad["input_ids"].clone()
    bad["input_ids"][0, -1] = 10_000
    start = time.monotonic()
    with pytest.raises(IndexError) as raised:
        two.compute_logprobs(bad, temperature=0.8)
    assert time.monotonic() - start < 60
    assert any("the group was shut down" in note for note in getattr(raised.value, "__notes__", []))
    with pytest.raises(RuntimeError, match="was closed"):
        two.compute_logprobs(batch, temperature=0.8)

    # a dead rank is an error naming it
    three = RayActorGroup(cfg3, total_steps=10, weights_path=str(saved), with_reference=False)
    ray.kill(three.ranks[1])
    with pytest.raises(RuntimeError, match=r"actor.rank_logprobs: rank process\(es\) \[1\] died"):
        three.compute_logprobs(batch, temperature=0.8)


def test_sharded_single_update_without_old_logprobs_matches_the_in_process_one(tiny_model_dir: Path) -> None:
    """One optimizer step (`algorithm.old_logprobs=auto`): each rank detaches its own log-probs as the old ones and
    the diagnostics summed over ranks (entropy, rollout mismatch) are the whole batch's token means."""
    cfg = worker_config(tiny_model_dir, ranks=2)
    cfg.actor.ppo_epochs, cfg.actor.mini_batch_size = 1, 8
    group = RayActorGroup(cfg, total_steps=10, weights_path=str(tiny_model_dir), with_reference=False)
    single = in_process_actor(cfg, tiny_model_dir)
    batch = random_batch(single.model.config.vocab_size)
    lp, _ = single.compute_logprobs(batch, temperature=0.8)
    batch["rollout_logprobs"] = (lp + 0.03 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(2))) * (
        batch.loss_mask
    )
    expected = single.update_policy(batch, temperature=0.8)
    got = group.update_policy(batch, temperature=0.8)
    assert "actor/entropy" in expected and expected["mismatch/mismatch_abs_logprob_diff_mean"] > 0.01
    assert expected["mismatch/mismatch_abs_logprob_diff_max"] > expected["mismatch/mismatch_abs_logprob_diff_mean"]
    assert_metrics_close(got, expected)  # the max too: both ranks hold rows, so summing the two maxima would show
    assert_weights_close(dict(group.named_weights()), dict(single.model.state_dict()))
    group.close()


def test_sharded_critic_matches_the_in_process_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = worker_config(tiny_model_dir, ranks=2)
    group = RayActorGroup(cfg, total_steps=10, weights_path=str(tiny_model_dir), with_reference=False,
                          critic_path=str(tiny_model_dir))  # fmt: skip
    assert group.critic is not None
    single = ValueCritic(
        ValueModel.from_pretrained(cfg.model, str(tiny_model_dir)),
        critic=cfg.critic,
        loss_agg_mode=cfg.algorithm.policy_loss.agg_mode,
        total_steps=10,
        mini_batch_rows=3,
        device=CPU,
    )
    batch = random_batch(single.model.backbone.config.vocab_size, seed=3)
    batch["values"] = single.compute_values(batch)
    assert torch.equal(batch["values"], torch.zeros_like(batch["values"]))  # zero-initialised head
    targets = torch.linspace(-1, 1, batch.loss_mask.numel()).reshape(batch.loss_mask.shape)
    batch["returns"] = targets * batch.loss_mask
    expected = single.update_critic(batch)
    assert_metrics_close(group.critic.update_critic(batch), expected)
    expected_values = single.compute_values(batch)
    assert expected_values.abs().max() > 1e-3  # the update moved the values
    torch.testing.assert_close(group.critic.compute_values(batch), expected_values, rtol=1e-4, atol=1e-5)

    saved = tmp_path / "critic"
    group.critic.save_pretrained(str(saved))
    reloaded = ValueCritic(
        ValueModel.from_pretrained(cfg.model, str(saved)),
        critic=cfg.critic,
        loss_agg_mode=cfg.algorithm.policy_loss.agg_mode,
        total_steps=10,
        mini_batch_rows=3,
        device=CPU,
    )
    reloaded.load_state_dict(group.critic.state_dict())
    torch.testing.assert_close(reloaded.compute_values(batch), expected_values, rtol=1e-4, atol=1e-5)
    assert_metrics_close(reloaded.update_critic(batch), single.update_critic(batch))
    group.close()


def read_metrics(output_dir: Path) -> list[dict[str, float]]:
    volatile = ("timing/", "perf/")
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(volatile)} for line in lines]


def test_trainer_on_two_ranks_matches_one_process_and_resumes_across_rank_counts(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """PPO with GAE and a KL loss, so actor, reference and critic all live on the ranks; a 16-row batch in
    mini-batches of 12 + 4 rows."""
    steps = ["trainer.total_steps=2", "trainer.save_every=1", "algorithm.advantage.estimator=gae"]
    two_ranks = ["distributed.num_ranks=2", "distributed.cpus_per_rank=0.5", "distributed.timeout_s=300",
                 "distributed.rollout_on_ranks=false"]  # fmt: skip
    run(tiny_model_dir, tmp_path / "one", steps)
    expected = read_metrics(tmp_path / "one")
    # the engine is built on the actor (engine= a factory): with a sharded actor and rollout_on_ranks=false, one
    # engine on the driver samples from its own copy synced through the driver (test_distributed_rollout: one on
    # every rank)
    tokenizer = load_pretrained_tokenizer(tiny_model_dir)
    trainer = Trainer(
        tiny_config(tiny_model_dir, tmp_path / "two", [*steps, *two_ranks]),
        engine=lambda module: SharedModuleEngine(module, tokenizer),
        reward_fn=digit_reward,
        train_data=sum_rows(8),
        val_data=sum_rows(4, seed=1),
    )
    assert isinstance(trainer.parts.actor, RayActorGroup) and trainer.parts.critic is trainer.parts.actor.critic
    trainer.fit()
    trainer.parts.actor.close()
    got = read_metrics(tmp_path / "two")
    assert [m["step"] for m in got] == [1, 2]
    assert got[1]["actor/kl_loss"] > 0  # the policy moved away from the reference on the ranks
    assert got[1]["critic/vf_loss"] > 0
    for got_step, expected_step in zip(got, expected, strict=True):
        assert_metrics_close(got_step, expected_step)

    # the 2-rank checkpoint of step 1 resumes in one process and gives the uninterrupted run's step 2
    resumed = tmp_path / "resumed"
    run(tiny_model_dir, resumed, [*steps, f"trainer.resume={tmp_path / 'two' / 'checkpoints' / 'step_1'}"])
    assert_metrics_close(read_metrics(resumed)[-1], expected[1])


def test_lora_on_two_ranks_matches_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    """LoRA (peft) sharded: the reference is the adapter-disabled base on the same ranks, the engine receives the
    merged weights, and the checkpoint (each rank's DCP shard of base + adapter) resumes in one process and exports
    to the one-process run's merged HF weights."""
    pytest.importorskip("peft")
    lora = ["model.lora_rank=4", "model.lora_alpha=8", "actor.lr=1e-2", "algorithm.kl.use_loss=true"]
    steps = ["trainer.total_steps=2", "trainer.save_every=1", *lora]
    two_ranks = ["distributed.num_ranks=2", "distributed.cpus_per_rank=0.5", "distributed.timeout_s=300"]
    run(tiny_model_dir, tmp_path / "one", steps)
    expected = read_metrics(tmp_path / "one")

    engine = SamplingEngine(tiny_model_dir)
    trainer = Trainer(
        tiny_config(tiny_model_dir, tmp_path / "two", [*steps, *two_ranks]),
        engine=engine,
        reward_fn=digit_reward,
        train_data=sum_rows(8),
        val_data=sum_rows(4, seed=1),
    )
    group = trainer.parts.actor
    assert isinstance(group, RayActorGroup)
    trainer.fit()
    got = read_metrics(tmp_path / "two")
    assert got[1]["actor/kl_loss"] > 0  # the adapter moved the policy off the adapter-free reference
    for got_step, expected_step in zip(got, expected, strict=True):
        assert_metrics_close(got_step, expected_step)
    # the engine holds the merged policy: the same tensors the one-process run's checkpoint saved
    merged = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "checkpoints" / "step_2").state_dict())
    assert_weights_close(dict(engine.model.state_dict()), merged)
    step1 = tmp_path / "two" / "checkpoints" / "step_1"
    assert (step1 / "sharded" / "actor" / "adapter_config.json").is_file()
    assert not (step1 / "model.safetensors").exists()  # ranks write shards; export-hf makes the HF folder
    group.close()
    export_cli(["export-hf", str(step1), str(tmp_path / "hf")])
    one_step1 = AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "checkpoints" / "step_1").state_dict()
    assert_weights_close(dict(AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()), dict(one_step1))

    resumed = tmp_path / "resumed"
    run(tiny_model_dir, resumed, [*steps, f"trainer.resume={step1}"])
    assert_metrics_close(read_metrics(resumed)[-1], expected[1])


def test_bnpo_on_two_ranks_averages_the_token_means_of_every_ranks_micro_batches(tiny_model_dir: Path) -> None:
    """TRL's bnpo on data-parallel ranks: each rank's micro-batches' token means, divided by the number of
    micro-batches on ALL ranks (TRL: accumulation steps x DDP's device average). The expectation is computed
    here in one process from the same row split and micro-batch budget; the ranks report the gradient norm."""
    from rlloom.core_rl.algorithms import ppo_policy_loss
    from rlloom.core_rl.distributed.partition import balance_rows
    from rlloom.core_rl.workers.forward import response_logprobs

    cfg = worker_config(tiny_model_dir, ranks=2)
    cfg.algorithm.policy_loss.agg_mode = "bnpo"
    cfg.algorithm.entropy.coef = 0.0
    cfg.actor.ppo_epochs, cfg.actor.mini_batch_size, cfg.actor.shuffle = 1, 8, False
    single = in_process_actor(cfg, tiny_model_dir)
    batch = random_batch(single.model.config.vocab_size)
    old, _ = single.compute_logprobs(batch, temperature=1.0)
    batch["old_logprobs"] = old - 0.05 * batch.loss_mask

    budget = cfg.actor.max_tokens_per_micro_batch
    split = balance_rows([int(n) for n in batch["attention_mask"].sum(-1).tolist()], 2)
    micro_batches = [micro for rows in split for _, micro in batch.select(rows).micro_batches(budget, padded=True)]
    assert len(micro_batches) > 2
    for micro in micro_batches:
        logprobs, _ = response_logprobs(single.model, micro, temperature=1.0)
        loss, _ = ppo_policy_loss(
            logprobs, micro["old_logprobs"], micro["advantages"], micro.loss_mask, clip_low=0.2, clip_high=0.28
        )
        (loss / len(micro_batches)).backward()  # type: ignore[no-untyped-call]
    grads = [p.grad for p in single.model.parameters() if p.grad is not None]
    expected_norm = float(torch.nn.utils.get_total_norm(grads))

    group = RayActorGroup(cfg, total_steps=10, weights_path=str(tiny_model_dir), with_reference=False)
    try:
        metrics = group.update_policy(batch, temperature=1.0)
    finally:
        group.close()
    assert metrics["actor/grad_norm"] == pytest.approx(expected_norm, rel=1e-4)
