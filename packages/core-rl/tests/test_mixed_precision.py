"""Mixed precision: fp32 master weights with bf16 compute follow an fp32 run; pure bf16 parameters lose updates.

The independent expectation is arithmetic: AdamW moves each weight by about lr per step, and a bf16 weight keeps a
change only if it is at least half a bf16 step (2^-9 of its size). At lr 1e-6 with weights of size ~0.02 that is
only the ~2% of weights smaller than ~5e-4, so a pure-bf16 run changes few weights, while fp32 and fp32-master runs
change all of them, in nearly the same direction. Checked in-process (bf16 autocast on CPU) and on 2 gloo ranks
(FSDP2 `MixedPrecisionPolicy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from test_workers import random_batch

from rlloom.core_rl.config.schema import ActorConfig, AlgorithmConfig, ModelConfig, RLConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.workers.actor import PolicyActor, load_causal_lm
from rlloom.core_rl.workers.precision import compute_autocast, fsdp_mixed_precision, load_dtype, model_precision

pytestmark = [pytest.mark.slow]

CPU = torch.device("cpu")
STEPS = 20
LR = 1e-6
ACTOR = {"lr": LR, "ppo_epochs": 1, "mini_batch_size": 7, "warmup_steps": 0}
ALGORITHM = {"advantage": {"estimator": "reinforce_plus_plus"}}


def with_param_dtype(cfg: ModelConfig, name: str) -> ModelConfig:
    """`model.param_dtype` set, through the config's validation."""
    return ModelConfig.model_validate({**cfg.model_dump(), "param_dtype": name})


def test_model_dtype_is_the_compute_dtype_and_parameters_default_to_fp32(tmp_path: Path) -> None:
    bf16 = ModelConfig(path=str(tmp_path), dtype="bfloat16")
    mixed = model_precision(bf16)
    assert (mixed.params, mixed.compute, mixed.mixed) == (torch.float32, torch.bfloat16, True)
    assert load_dtype(bf16, trained=True) == torch.float32  # the optimizer steps fp32 master weights
    assert load_dtype(bf16, trained=False) == torch.bfloat16  # a frozen copy is only ever computed with
    pure = model_precision(with_param_dtype(bf16, "bfloat16"))
    assert (pure.params, pure.mixed) == (torch.bfloat16, False)
    assert fsdp_mixed_precision(pure) is None
    policy = fsdp_mixed_precision(mixed)
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert not model_precision(ModelConfig(path=str(tmp_path))).mixed
    with pytest.raises(ValueError, match=r"bfloat16 with model.dtype=float32.*param_dtype=float32"):
        with_param_dtype(ModelConfig(path=str(tmp_path)), "bfloat16")


def test_compute_autocast_runs_matmuls_in_bf16_on_cpu_with_fp32_gradients() -> None:
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with compute_autocast(CPU, True):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()  # type: ignore[no-untyped-call]
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32
    with compute_autocast(CPU, False):
        assert layer(x).dtype == torch.float32


def actor_for(model_dir: Path, model_cfg: ModelConfig) -> PolicyActor:
    return PolicyActor(
        load_causal_lm(model_cfg, str(model_dir), CPU),
        actor=ActorConfig(**ACTOR),  # type: ignore[arg-type]
        algorithm=AlgorithmConfig(**ALGORITHM),  # type: ignore[arg-type]
        total_steps=STEPS,
        mini_batch_rows=7,
        max_response_length=9,
        device=CPU,
        bf16=model_precision(model_cfg).bf16_compute,
    )


def flat(weights: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([weights[name].detach().float().flatten() for name in sorted(weights)])


def trained_delta(step: Any, weights: Any, batch: TrajectoryBatch) -> torch.Tensor:
    """All weights' change from their own start (in their own dtype) after `STEPS` calls of `step(batch)`, each one
    AdamW step; flattened in name order."""
    start = flat(dict(weights()))
    for _ in range(STEPS):
        step(batch)
    return flat(dict(weights())) - start


@dataclass
class Fp32Run:
    """The expectation: an all-fp32 run's batch, weight change and parameter bytes."""

    batch: TrajectoryBatch
    delta: torch.Tensor
    parameter_bytes: int


@pytest.fixture(scope="module")
def fp32_run(tiny_model_dir: Path) -> Fp32Run:
    actor = actor_for(tiny_model_dir, ModelConfig(path=str(tiny_model_dir)))
    batch = random_batch(actor.model.config.vocab_size)
    delta = trained_delta(actor.update_policy, actor.model.state_dict, batch)
    return Fp32Run(batch, delta, actor.state_bytes()["parameters"])


def changed_share(delta: torch.Tensor) -> float:
    return float((delta != 0).float().mean())


def relative_error(delta: torch.Tensor, expected: torch.Tensor) -> float:
    return float((delta - expected).norm() / expected.norm())


def check_mixed_follows_and_pure_bf16_loses(mixed: torch.Tensor, pure: torch.Tensor, fp32: torch.Tensor) -> None:
    assert changed_share(fp32) > 0.99  # every weight not pinned by a zero gradient moves in fp32
    # fp32 masters with bf16 compute: every weight moves, in nearly the fp32 run's direction (bf16 gradients
    # differ in their low bits, so Adam's sign-like early steps differ for the near-zero gradients)
    assert changed_share(mixed) > 0.99
    assert relative_error(mixed, fp32) < 0.2, relative_error(mixed, fp32)
    # pure bf16 parameters: AdamW's ~1e-6 steps round away except on the smallest weights
    assert changed_share(pure) < 0.1, changed_share(pure)
    assert relative_error(pure, fp32) > 0.8, relative_error(pure, fp32)


@pytest.mark.slow
def test_in_process_fp32_masters_follow_fp32_while_bf16_parameters_lose_updates(
    tiny_model_dir: Path, fp32_run: Fp32Run
) -> None:
    batch, fp32 = fp32_run.batch, fp32_run.delta
    bf16 = ModelConfig(path=str(tiny_model_dir), dtype="bfloat16")
    deltas = []
    for cfg in (bf16, with_param_dtype(bf16, "bfloat16")):
        actor = actor_for(tiny_model_dir, cfg)
        deltas.append(trained_delta(actor.update_policy, actor.model.state_dict, batch))
    mixed, pure = deltas
    assert next(actor.model.parameters()).dtype == torch.bfloat16  # the last one held bf16 parameters
    print(f"in-process: changed fp32 {changed_share(fp32):.3f} mixed {changed_share(mixed):.3f} bf16 "
          f"{changed_share(pure):.3f}; update rel. error mixed {relative_error(mixed, fp32):.3f} bf16 "
          f"{relative_error(pure, fp32):.3f}")  # fmt: skip
    check_mixed_follows_and_pure_bf16_loses(mixed, pure, fp32)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_gloo_ranks_with_mixed_precision_policy_follow_fp32(tiny_model_dir: Path, fp32_run: Fp32Run) -> None:
    ray = pytest.importorskip("ray")
    from rlloom.core_rl.distributed.ray_group import RayActorGroup
    from rlloom.core_rl.distributed.ray_start import start_ray

    batch, fp32 = fp32_run.batch, fp32_run.delta
    owns_ray = not ray.is_initialized()
    if owns_ray:
        start_ray(None, num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        deltas = []
        for param_dtype in ("float32", "bfloat16"):
            cfg = RLConfig.model_validate(
                {
                    "model": {"path": str(tiny_model_dir), "dtype": "bfloat16"},
                    "rollout": {"n": 1, "max_tokens": 9},
                    "algorithm": ALGORITHM,
                    "actor": ACTOR,
                    "trainer": {"device": "cpu"},
                    "distributed": {"num_ranks": 2, "cpus_per_rank": 0.5, "timeout_s": 600},
                }
            )
            cfg.model = with_param_dtype(cfg.model, param_dtype)
            group = RayActorGroup(cfg, total_steps=STEPS, weights_path=str(tiny_model_dir), with_reference=False)
            try:
                kept = group.call("actor", "state_bytes")  # each rank's shards: fp32 masters are 4 bytes a value
                deltas.append(trained_delta(group.update_policy, group.named_weights, batch))
            finally:
                group.close()
            share = 1.0 if param_dtype == "float32" else 0.5  # FSDP2 pads uneven shards by < 1 row
            assert sum(rank["parameters"] for rank in kept) == pytest.approx(fp32_run.parameter_bytes * share, rel=0.05)
        mixed, pure = deltas
        print(f"2 ranks: changed mixed {changed_share(mixed):.3f} bf16 {changed_share(pure):.3f}; update rel. "
              f"error mixed {relative_error(mixed, fp32):.3f} bf16 {relative_error(pure, fp32):.3f}")  # fmt: skip
        check_mixed_follows_and_pure_bf16_loses(mixed, pure, fp32)
    finally:
        if owns_ray:
            ray.shutdown()
