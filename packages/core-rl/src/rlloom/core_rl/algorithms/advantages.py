"""Advantage estimators as pure tensor functions: GRPO / Dr.GRPO, RLOO, GPG, ReMax, GAE, REINFORCE++(-baseline).

Outcome estimators (GRPO, RLOO, GPG, ReMax) take one score per response ([B]) and return one advantage per response;
the trainer broadcasts it over the response tokens (see `estimators.py`). Token estimators (GAE, REINFORCE++) take
[B, T] tensors and a mask. Tokens with mask 0 *inside* a response (tool observations in multi-turn trajectories)
are skipped by the recursions as if they were absent: they get advantage 0 and do not break the chain. Nothing
here carries a gradient: inputs are detached. Outputs are at least float32 (bf16 or integer inputs are upcast).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlloom.core_rl.algorithms.groups import GroupIds, group_stats
from rlloom.core_rl.algorithms.masked_stats import check_same_shape, masked_whiten


def check_rewards_on_valid_tokens(token_rewards: Tensor, mask: Tensor) -> None:
    """Refuse rewards placed on masked tokens: the estimators would otherwise drop them silently."""
    stray = (token_rewards != 0) & ~mask.bool()
    if bool(stray.any()):
        rows = stray.any(dim=-1).nonzero().flatten().tolist()[:5]
        raise ValueError(
            f"token_rewards has non-zero values where mask is 0 (rows {rows}); place each score on a token with "
            "mask 1 (usually the last generated token), or it would be ignored"
        )


def grpo_advantages(
    scores: Tensor,
    group_ids: GroupIds,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    std_scope: str = "group",
) -> Tensor:
    """GRPO: Aᵢ = (rᵢ − mean_g) / (std_g + eps) over the responses g sampled from the same prompt.

    std is the sample std with Bessel's correction (as `torch.std`); a group of one gets 0. `norm_by_std=False`
    is Dr.GRPO's unbiased variant Aᵢ = rᵢ − mean_g. `std_scope="batch"` divides by the std of the whole batch's
    scores instead (group mean, batch std: TRL's `scale_rewards="batch"`; Liu et al. 2025, "Part I: Tricks or
    Traps?", find it more robust when a group's rewards barely differ).
    Shao et al. 2024, "DeepSeekMath" (GRPO); Liu et al. 2025, "Understanding R1-Zero-Like Training" (Dr.GRPO).
    """
    if std_scope not in ("group", "batch"):
        raise ValueError(f"std_scope must be 'group' or 'batch', got {std_scope!r}")
    stats = group_stats(scores, group_ids)
    x = scores.detach().to(stats.mean.dtype)
    adv = x - stats.mean
    if norm_by_std:
        std = stats.std if std_scope == "group" else (x.std() if x.numel() > 1 else x.new_zeros(()))
        adv = adv / (std + eps)
    return torch.where(stats.count > 1, adv, torch.zeros_like(adv))


def grpo_passk_advantages(
    scores: Tensor, group_ids: GroupIds, *, norm_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Pass@k GRPO: only each group's best response gets an advantage, r_max − r_second (÷ (std_g + eps)).

    Optimises the chance that the best of k samples is right rather than the average sample; ties go to the
    first best response in batch order, and a group of one gets 0. arXiv 2503.19595 (veRL `grpo_passk`).
    """
    stats = group_stats(scores, group_ids)
    x = scores.detach().to(stats.mean.dtype)
    index = stats.index
    num_groups = int(index.max().item()) + 1 if x.numel() else 0
    neg_inf = torch.full((num_groups,), float("-inf"), dtype=x.dtype, device=x.device)
    best = neg_inf.scatter_reduce(0, index, x, reduce="amax")
    positions = torch.arange(x.shape[0], device=x.device)
    is_best = x == best[index]
    first = torch.full((num_groups,), x.shape[0], dtype=torch.long, device=x.device)
    first = first.scatter_reduce(0, index, torch.where(is_best, positions, x.shape[0]), reduce="amin")
    chosen = positions == first[index]
    second = neg_inf.scatter_reduce(0, index, torch.where(chosen, float("-inf"), x), reduce="amax")
    gap = (best - second)[index]
    adv = torch.where(chosen & (stats.count > 1), gap, torch.zeros_like(x))
    if norm_by_std:
        adv = adv / (stats.std + eps)
    return adv


def rloo_advantages(scores: Tensor, group_ids: GroupIds) -> Tensor:
    """RLOO: Aᵢ = rᵢ − mean_{j≠i} rⱼ = n/(n−1)·(rᵢ − mean_g) (leave-one-out baseline); a group of one gets 0.

    Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!"; Ahmadian et al. 2024, "Back to Basics".
    """
    stats = group_stats(scores, group_ids)
    n = stats.count
    adv = (scores.detach().to(n.dtype) - stats.mean) * n / (n - 1).clamp(min=1)
    return torch.where(n > 1, adv, torch.zeros_like(adv))


def gpg_advantages(scores: Tensor, group_ids: GroupIds, *, f_norm: float = 1.0) -> Tensor:
    """GPG: Aᵢ = α·(rᵢ − mean_g)/F_norm with α = B / max(#{j : rⱼ ≠ 0}, 1) over the whole batch of B responses.

    The group mean is the baseline, with no std division. α scales the batch's gradient up when few responses
    score non-zero, so groups that carry no signal do not dilute the update toward zero. This is veRL's
    `compute_gpg_outcome_advantage` (`adv_estimator=gpg`; its F_norm is 1). The paper's own code counts differently,
    α = B / (B − M) with M the responses in groups whose rewards are all equal: an all-correct group adds to veRL's
    count of non-zero scores but not to the paper's valid ones. A group of one gets 0 (veRL: α·rᵢ).
    Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning"
    (arXiv 2504.02546); pair it with `policy_loss=gpg` (−A·log π), as veRL's recipe does.
    """
    if f_norm <= 0:
        raise ValueError(f"f_norm must be > 0, got {f_norm}")
    stats = group_stats(scores, group_ids)
    x = scores.detach().to(stats.mean.dtype)
    nonzero = int(torch.count_nonzero(x))
    alpha = x.shape[0] / max(nonzero, 1)
    adv = alpha * (x - stats.mean) / f_norm
    return torch.where(stats.count > 1, adv, torch.zeros_like(adv))


def opo_advantages(scores: Tensor, group_ids: GroupIds, lengths: Tensor) -> Tensor:
    """OPO: Aᵢ = rᵢ − b_g with the length-weighted baseline b_g = Σⱼ|yⱼ|rⱼ / Σⱼ|yⱼ|; a group of one gets 0.

    The baseline that minimises gradient variance when the per-token gradient norms are similar, so longer
    responses weigh more in it. Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline" (arXiv 2505.23585).
    """
    check_same_shape(scores=scores, lengths=lengths)
    weights = lengths.detach().to(torch.promote_types(scores.dtype, torch.float32))
    if bool((weights < 0).any()):
        raise ValueError("lengths must be ≥ 0 (response lengths in tokens)")
    stats = group_stats(scores, group_ids)
    x = scores.detach().to(weights.dtype)
    num_groups = int(stats.index.max().item()) + 1 if x.numel() else 0
    weighted = torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, stats.index, weights * x)
    total = torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, stats.index, weights)
    group_baseline = (weighted / total.clamp(min=torch.finfo(x.dtype).tiny))[stats.index]
    # A group whose responses are all empty has no length weights: fall back to the plain mean.
    baseline = torch.where(total[stats.index] > 0, group_baseline, stats.mean)
    adv = x - baseline
    return torch.where(stats.count > 1, adv, torch.zeros_like(adv))


def remax_advantages(scores: Tensor, baseline_scores: Tensor) -> Tensor:
    """ReMax: Aᵢ = r(yᵢ) − r(ŷᵢ), the baseline being the reward of the greedy response to the same prompt.

    Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning LLMs".
    """
    check_same_shape(scores=scores, baseline_scores=baseline_scores)
    dtype = torch.promote_types(torch.promote_types(scores.dtype, baseline_scores.dtype), torch.float32)
    return scores.detach().to(dtype) - baseline_scores.detach().to(dtype)


def _reverse_recursion(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Backward GAE sweep over valid tokens only; masked positions carry next value and running sum across."""
    valid = mask.bool()
    dtype = torch.promote_types(torch.promote_types(values.dtype, token_rewards.dtype), torch.float32)
    rewards = token_rewards.detach().to(dtype)
    vals = values.detach().to(dtype)
    batch, length = vals.shape
    advantages = torch.zeros_like(vals)
    next_value = torch.zeros(batch, dtype=dtype, device=vals.device)
    running = torch.zeros(batch, dtype=dtype, device=vals.device)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        candidate = delta + gamma * lam * running
        running = torch.where(valid[:, t], candidate, running)
        next_value = torch.where(valid[:, t], vals[:, t], next_value)
        advantages[:, t] = torch.where(valid[:, t], candidate, torch.zeros_like(candidate))
    returns = torch.where(valid, advantages + vals, torch.zeros_like(vals))
    return advantages, returns


def gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation over the masked response; returns `(advantages, returns)`, both [B, T].

    δₜ = rₜ + γ·V(next valid token) − Vₜ (V after the last valid token is 0), Aₜ = δₜ + γλ·A(next valid token),
    returns = A + V. Tokens with mask 0 inside a response are absent for the recursion (advantage 0, chain
    unbroken), so the result equals GAE on the sequence with those tokens removed. No whitening here: call
    `masked_whiten(advantages, mask)` if wanted. Schulman et al. 2015, "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation".
    """
    check_same_shape(token_rewards=token_rewards, values=values, mask=mask)
    if token_rewards.dim() != 2:
        raise ValueError(f"token_rewards must be [B, T], got shape {tuple(token_rewards.shape)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must lie in [0, 1], got gamma={gamma}, lam={lam}")
    check_rewards_on_valid_tokens(token_rewards, mask)
    return _reverse_recursion(token_rewards, values, mask, gamma=gamma, lam=lam)


def discounted_returns(token_rewards: Tensor, mask: Tensor, *, gamma: float) -> Tensor:
    """Gₜ = Σ_{k≥t, valid} γ^(#valid tokens between t and k)·r_k, 0 on masked tokens (reward-to-go)."""
    check_same_shape(token_rewards=token_rewards, mask=mask)
    check_rewards_on_valid_tokens(token_rewards, mask)
    zeros = torch.zeros_like(token_rewards, dtype=torch.promote_types(token_rewards.dtype, torch.float32))
    # GAE with V ≡ 0 and λ = 1 is exactly the discounted reward-to-go.
    returns, _ = _reverse_recursion(token_rewards, zeros, mask, gamma=gamma, lam=1.0)
    return returns


def reinforce_pp_advantages(token_rewards: Tensor, mask: Tensor, *, gamma: float) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted returns Gₜ whitened over every valid token of the batch; returns `(advantages, G)`.

    A = (G − mean_batch(G)) / std_batch(G) on valid tokens, 0 elsewhere (Bessel-corrected std as veRL).
    Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models" (arXiv 2501.03262).
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    returns = discounted_returns(token_rewards, mask, gamma=gamma)
    return masked_whiten(returns, mask), returns


def reinforce_pp_baseline_advantages(scores: Tensor, group_ids: GroupIds, mask: Tensor) -> Tensor:
    """REINFORCE++-baseline: Aᵢ = rᵢ − mean_g, broadcast over the response tokens, then whitened over the batch.

    The group mean removes the prompt's difficulty; the global (batch) normalisation replaces GRPO's per-group std,
    which the paper argues biases toward easy or hard prompts. A group of one has rᵢ − mean_g = 0 before
    whitening (veRL instead leaves singleton scores un-centred). Hu 2025, arXiv 2501.03262 (v2+, "REINFORCE++-
    baseline"); veRL `compute_reinforce_plus_plus_baseline_outcome_advantage`.
    """
    if mask.dim() != 2 or mask.shape[0] != scores.shape[0]:
        raise ValueError(f"mask must be [B, T] with B = len(scores) = {scores.shape[0]}, got {tuple(mask.shape)}")
    stats = group_stats(scores, group_ids)
    centred = scores.detach().to(stats.mean.dtype) - stats.mean
    per_token = centred.unsqueeze(-1).expand(mask.shape)
    return masked_whiten(per_token, mask)
