"""The keyword arguments of the actor, reference and critic workers, from a run's config.

One place for them, read by the in-process set-up (`run_setup`) and by every Ray rank (`distributed.ray_group`),
so both build the same workers and neither module imports the other.
"""

from __future__ import annotations

from typing import Any

import torch

from rlloom.core_rl.config.schema import RLConfig
from rlloom.core_rl.workers.precision import model_precision


def bf16_compute(cfg: RLConfig) -> bool:
    """Whether forwards compute in bf16: `model.dtype` is the compute dtype (see `precision`)."""
    return model_precision(cfg.model).bf16_compute


def actor_settings(cfg: RLConfig, total_steps: int, device: torch.device) -> dict[str, Any]:
    """`PolicyActor`'s keyword arguments besides the model (the sharded actor on each rank takes the same)."""
    return {
        "actor": cfg.actor,
        "algorithm": cfg.algorithm,
        "total_steps": total_steps,
        "mini_batch_rows": cfg.mini_batch_rows("actor"),
        "max_response_length": cfg.rollout.max_tokens,
        "device": device,
        "bf16": bf16_compute(cfg),
        "seed": cfg.trainer.seed,
    }


def reference_settings(cfg: RLConfig, device: torch.device) -> dict[str, Any]:
    """`ReferencePolicy`'s keyword arguments besides the model."""
    budget = cfg.actor.max_tokens_per_micro_batch
    return {
        "max_tokens": budget,
        "packed": cfg.actor.padding_free,
        "device": device,
        "bf16": bf16_compute(cfg),
        "share_prompts": cfg.actor.share_prompt_forward,
    }


def critic_settings(cfg: RLConfig, total_steps: int, device: torch.device) -> dict[str, Any]:
    """`ValueCritic`'s keyword arguments besides the model."""
    return {
        "critic": cfg.critic,
        "loss_agg_mode": cfg.algorithm.policy_loss.agg_mode,
        "total_steps": total_steps,
        "mini_batch_rows": cfg.mini_batch_rows("critic"),
        "device": device,
        "bf16": bf16_compute(cfg),
        "seed": cfg.trainer.seed,
    }


__all__ = ["actor_settings", "bf16_compute", "critic_settings", "reference_settings"]
