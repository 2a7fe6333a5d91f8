"""KL estimators between the policy and the reference model, per token, and KL as a reward penalty.

With Δ = log π(y) − log π_ref(y) on tokens sampled from π (Schulman 2020, "Approximating KL Divergence"):
k1 = Δ (unbiased, high variance, can be negative), k2 = ½Δ² (biased, low variance), k3 = e^(−Δ) + Δ − 1
(unbiased, low variance, ≥ 0), abs = |Δ|. A `+` suffix (e.g. `k3+`) is the straight-through variant veRL offers:
the value of the estimator with the gradient of k2, whose gradient is the unbiased gradient of KL(π‖π_ref).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlloom.core_rl.algorithms.masked_stats import check_same_shape, masked_mean
from rlloom.core_rl.algorithms.registry import UnknownNameError, unknown_name_message
from rlloom.core_rl.config.catalog import KL_KINDS  # the names, torch-free, so the config checks them

__all__ = ["KL_KINDS", "apply_kl_in_reward", "kl_penalty"]


def _estimate(delta: Tensor, kind: str, clamp: float | None) -> Tensor:
    if kind == "k1":
        return delta
    if kind == "k2":
        return 0.5 * delta.square()
    if kind == "abs":
        return delta.abs()
    # k3 = exp(ref − logp) − (ref − logp) − 1; clamping the log-ratio first keeps exp finite (veRL: ±20).
    neg = -delta
    if clamp is not None:
        neg = neg.clamp(-20.0, 20.0)
    k3 = torch.exp(neg) - neg - 1.0
    return k3.clamp(-clamp, clamp) if clamp is not None else k3


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3", *, clamp: float | None = 10.0) -> Tensor:
    """Per-token KL estimate [B, T] of KL(π‖π_ref) of kind k1 | k2 | k3 | abs, optionally with a `+` suffix.

    `clamp` bounds k3 to [−clamp, clamp] (and its log-ratio to ±20) for stability as veRL does; None disables it.
    `k3+` = k2 − sg(k2) + sg(k3): k3's value, k2's gradient. Mask the result yourself (or use `aggregate`).
    """
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    straight_through = kind.endswith("+")
    base = KL_KINDS.get(kind[:-1] if straight_through else kind)
    if base is None:
        valid = sorted([*KL_KINDS, *(f"{k}+" for k in KL_KINDS)])
        raise UnknownNameError(unknown_name_message("KL estimator", kind, valid))
    delta = logprobs - ref_logprobs
    value = _estimate(delta, base, clamp)
    if not straight_through:
        return value
    grad_path = 0.5 * delta.square()
    return grad_path - grad_path.detach() + value.detach()


def apply_kl_in_reward(  # noqa: PLR0917 (signature fixed by issue 6)
    token_rewards: Tensor, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, coef: float, kind: str = "k1"
) -> tuple[Tensor, Tensor]:
    """r̃ₜ = rₜ − β·KLₜ on valid tokens (KL as a dense reward penalty, Ziegler et al. 2019; InstructGPT).

    Returns `(penalised token rewards, current_kl)`, where current_kl is the mean over sequences of each
    sequence's token-mean KL, the quantity `AdaptiveKLController.update` expects. Nothing carries a gradient.
    """
    check_same_shape(token_rewards=token_rewards, logprobs=logprobs, ref_logprobs=ref_logprobs, mask=mask)
    if coef < 0:
        raise ValueError(f"the KL coefficient must be ≥ 0, got {coef}")
    valid = mask.bool()
    kl = kl_penalty(logprobs.detach(), ref_logprobs.detach(), kind)
    kl = torch.where(valid, kl, torch.zeros_like(kl))
    rewards = token_rewards.detach() - coef * kl
    per_seq = masked_mean(kl, valid, dim=-1)
    has_tokens = valid.any(-1)
    current_kl = per_seq[has_tokens].mean() if bool(has_tokens.any()) else per_seq.new_zeros(())
    return rewards.to(token_rewards.dtype), current_kl
