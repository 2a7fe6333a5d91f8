"""The advantage phase: outcome rewards on each response's last sampled token, the KL penalty in the reward when
asked (Ziegler et al. 2019), then the configured estimator (GRPO, RLOO, GAE, ...) writes advantages and returns."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlloom.core_rl.algorithms import AdvantageInputs, apply_kl_in_reward, get_advantage_estimator
from rlloom.core_rl.algorithms.kl_control import KLController
from rlloom.core_rl.config.schema import AlgorithmConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.phases.reward_shaping import outcome_token_rewards


def compute_advantages(
    batch: TrajectoryBatch, trajectories: Sequence[Trajectory], algo: AlgorithmConfig, kl_ctrl: KLController
) -> dict[str, float]:
    """Fill `token_rewards`, `advantages` and `returns` of `batch`; moves the in-reward KL controller."""
    mask = batch.loss_mask
    token_rewards = outcome_token_rewards(batch["scores"], mask)
    out: dict[str, float] = {}
    if algo.kl.use_in_reward:
        token_rewards, current_kl = apply_kl_in_reward(
            token_rewards, batch["old_logprobs"], batch["ref_logprobs"], mask, kl_ctrl.value, algo.kl.reward_type
        )
        out["kl_in_reward/kl"] = float(current_kl)
        out["kl_in_reward/coef"] = kl_ctrl.value
        kl_ctrl.update(float(current_kl), n_steps=batch.batch_size)
    batch["token_rewards"] = token_rewards
    baselines = None
    advantage = algo.advantage
    if advantage.estimator == "remax":
        baselines = torch.tensor([t.extra_info["remax_baseline"] for t in trajectories], dtype=torch.float32)
    inputs = AdvantageInputs(
        token_rewards=token_rewards,
        mask=mask,
        group_ids=batch.non_tensors["group_id"],
        values=batch.tensors.get("values"),
        baseline_scores=baselines,
        gamma=advantage.gamma,
        lam=advantage.lam,
        norm_by_std=advantage.norm_by_std,
        std_scope=advantage.std_scope,
        eps=advantage.epsilon,
    )
    batch["advantages"], batch["returns"] = get_advantage_estimator(advantage.estimator)(inputs)
    return out
