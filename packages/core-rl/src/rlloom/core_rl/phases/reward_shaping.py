"""Reward shaping between the scorer and the advantages: DAPO's soft overlong punishment on each sample's score,
and the outcome reward placed on each response's last sampled token."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlloom.core_rl.algorithms import overlong_reward_penalty
from rlloom.core_rl.config.schema import ConfigError
from rlloom.core_rl.contracts.trajectory import Trajectory

OVERLONG_COMPONENT = "overlong_penalty"
"""The reward component that holds DAPO's overlong punishment (dynamic sampling filters on the score without it)."""


def punish_overlong(
    trajectories: Sequence[Trajectory], *, max_tokens: int, buffer: int, penalty_factor: float
) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13) against the response limit `max_tokens`, added to
    each reward and kept as the `overlong_penalty` component; returns the penalties."""
    multi_turn = next((t for t in trajectories if t.metrics.get("turns", 1) > 1 or 0 in t.loss_mask), None)
    if multi_turn is not None:
        # a multi-turn response holds observations and several turns, each with rollout.max_tokens of its own:
        # measured against one turn's budget, nearly every conversation would be punished
        turns = multi_turn.metrics.get("turns", "?")
        raise ConfigError(
            "algorithm.overlong (DAPO's overlong punishment) measures a single-turn response against "
            f"rollout.max_tokens, but the collector returned a multi-turn trajectory ({turns} turns, observation "
            "tokens in its response); set algorithm.overlong=null for agent training"
        )
    lengths = torch.tensor([len(t.response_ids) for t in trajectories])
    penalties = overlong_reward_penalty(
        lengths, max_length=max_tokens, buffer_length=buffer, penalty_factor=penalty_factor
    ).tolist()
    for traj, penalty in zip(trajectories, penalties, strict=True):
        traj.reward = (traj.reward or 0.0) + penalty
        traj.reward_components[OVERLONG_COMPONENT] = penalty
    return penalties


def overlong_metrics(penalties: Sequence[float]) -> dict[str, float]:
    """Mean soft overlong penalty and penalised share over every sample the step drew (all sampling rounds)."""
    count = max(len(penalties), 1)
    return {
        "overlong/penalty_mean": sum(penalties) / count,
        "overlong/penalised_frac": sum(p < 0 for p in penalties) / count,
    }


def outcome_token_rewards(scores: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """`[B, R]` rewards: each score on its response's last sampled token (0 for a response with none)."""
    positions = torch.arange(1, loss_mask.shape[1] + 1, device=loss_mask.device)
    last = (loss_mask * positions).argmax(-1)
    rewards = torch.zeros(loss_mask.shape, dtype=torch.float32, device=loss_mask.device)
    has_tokens = loss_mask.bool().any(-1)
    rows = torch.arange(loss_mask.shape[0], device=loss_mask.device)
    rewards[rows[has_tokens], last[has_tokens]] = scores[has_tokens].float()
    return rewards
