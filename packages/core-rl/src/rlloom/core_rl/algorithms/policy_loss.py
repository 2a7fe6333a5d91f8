"""Policy-gradient surrogate losses: PPO clip (asymmetric, dual clip), GSPO, GMPO, CISPO, GPG, SAPO, Clip-/KL-Cov;
selected by name.

Every loss takes per-token log-probs under the current policy (with grad), the old policy's log-probs (no grad),
advantages and the loss mask, all [B, T], and returns `(loss, metrics)`. Metrics are detached 0-dim tensors, so
the trainer decides when to synchronise with the device (`.item()` once per step, not per micro-batch).
`rollout_is_weights` (e.g. `tis_weights`) multiply the per-token loss to correct rollout/trainer mismatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from rlloom.core_rl.algorithms.aggregation import LossAggregation, aggregate_with
from rlloom.core_rl.algorithms.masked_stats import check_same_shape, masked_mean
from rlloom.core_rl.algorithms.registry import Registry

_LOG_RATIO_LIMIT = 20.0  # exp(±20) keeps the ratio finite in float32 when the policies have drifted far apart


class PolicyLossFn(Protocol):
    """The shape of every registered policy loss."""

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        clip_low: float,
        clip_high: float,
        dual_clip: float | None = None,
        agg: str | LossAggregation = "token-mean",
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


STANDARD_LOSS_ARGUMENTS = frozenset(
    {"logprobs", "old_logprobs", "advantages", "mask"}
    | {"clip_low", "clip_high", "dual_clip", "agg", "rollout_is_weights"}
)
"""What the actor passes to every loss; any other keyword of a loss is its own setting (`policy_loss_kwargs`)."""

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
_LossT = TypeVar("_LossT", bound=PolicyLossFn)


@dataclass(frozen=True, slots=True)
class LossTraits:
    """What a policy loss supports, declared where it is registered; the config refuses other settings at load.

    `dual_clip`: takes `dual_clip` (a loss whose ratio is already bounded does not). `sequence_level`: one loss
    term per sequence, so it has no per-token weights (TIS, high-entropy selection) and aggregates only as
    seq-mean-token-mean."""

    dual_clip: bool = True
    sequence_level: bool = False


def register_policy_loss(
    name: str, *, dual_clip: bool = True, sequence_level: bool = False
) -> Callable[[_LossT], _LossT]:
    """Decorator: make a `PolicyLossFn` selectable as `policy_loss=<name>`, declaring what it supports (the
    function is returned unchanged but for its `loss_traits` attribute)."""

    def decorator(fn: _LossT) -> _LossT:
        POLICY_LOSSES.register(name)(fn)
        fn.loss_traits = LossTraits(dual_clip=dual_clip, sequence_level=sequence_level)  # type: ignore[attr-defined]
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as `name` (raises with the valid names and the nearest match)."""
    return POLICY_LOSSES.get(name)


def policy_loss_traits(name: str) -> LossTraits:
    """What the loss registered as `name` supports (a loss registered without traits supports everything)."""
    traits = getattr(get_policy_loss(name), "loss_traits", None)
    return traits if isinstance(traits, LossTraits) else LossTraits()


def _check_inputs(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, weights: Tensor | None
) -> None:
    check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask)
    if weights is not None:
        check_same_shape(logprobs=logprobs, rollout_is_weights=weights)


def _check_clip(clip_low: float, clip_high: float) -> None:
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must lie in [0, 1) so that 1 − clip_low > 0, got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be ≥ 0, got {clip_high}")


def _zero_padding(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Both log-probs with 0 at the masked positions: padding often holds −inf there, and a loss whose backward
    multiplies by a value computed from it (exp(−inf − (−inf)) = nan) would send nan into the gradient even though
    the aggregation drops those tokens (0 · nan = nan)."""
    valid = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    return torch.where(valid, logprobs, zero), torch.where(valid, old_logprobs, zero.to(old_logprobs.dtype))


def _weighted(loss: Tensor, weights: Tensor | None) -> Tensor:
    return loss if weights is None else loss * weights.detach()


def _loss_metrics(
    log_ratio: Tensor, mask: Tensor, *, clipped: Tensor | None = None, clipped_lower: Tensor | None = None
) -> dict[str, Tensor]:
    """What every loss reports, detached: `pg_clipfrac` (share of valid tokens clipped, cut or penalised),
    `pg_clipfrac_lower` (dual clip active) and `ppo_kl` (mean of log π_old − log π); a flag not given is 0."""

    def share(flags: Tensor | None) -> Tensor:
        return log_ratio.new_zeros(()) if flags is None else masked_mean(flags.to(log_ratio.dtype), mask).detach()

    return {
        "pg_clipfrac": share(clipped),
        "pg_clipfrac_lower": share(clipped_lower),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }


@register_policy_loss("ppo")
def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    agg: str | LossAggregation = "token-mean",
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate, per token: L = max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)), ρ = π/π_old.

    ε_high > ε_low is DAPO's clip-higher (Yu et al. 2025). With `dual_clip = c > 1`, tokens with A < 0 are further
    bounded: L = min(L, −c·A) (Ye et al. 2020, "Mastering Complex Control in MOBA Games"), so a huge ratio on a
    bad token cannot blow up the loss. Schulman et al. 2017, "Proximal Policy Optimization Algorithms".
    Metrics: `pg_clipfrac` (tokens where the ε-clip is active), `pg_clipfrac_lower` (dual clip active),
    `ppo_kl` (mean of log π_old − log π, the approximate KL to the old policy).
    """
    _check_inputs(logprobs, old_logprobs, advantages, mask, rollout_is_weights)
    _check_clip(clip_low, clip_high)
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (Ye et al. use 3.0), got {dual_clip}")
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped
    dual_active = torch.zeros_like(clip_active)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual_active = (advantages < 0) & (loss > bound)
        loss = torch.where(dual_active, bound, loss)
    pg_loss = aggregate_with(_weighted(loss, rollout_is_weights), mask, agg)
    return pg_loss, _loss_metrics(log_ratio, mask, clipped=clip_active, clipped_lower=dual_active)


@register_policy_loss("gspo", dual_clip=False)
def gspo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    dual_clip: float | None = None,
    agg: str | LossAggregation = "seq-mean-token-mean",
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: clip a sequence-level ratio sᵢ = (πθ(yᵢ)/π_old(yᵢ))^(1/|yᵢ|) = exp(meanₜ(log π − log π_old)).

    Implemented as GSPO-token (Zheng et al. 2025, "Group Sequence Policy Optimization", eq. 13–14):
    sᵢₜ = sg[sᵢ]·π(yᵢₜ)/sg[π(yᵢₜ)], whose value is sᵢ and whose gradient is sg[sᵢ]·∇log π(yᵢₜ), then
    L = max(−A·sᵢₜ, −A·clip(sᵢₜ, 1 − ε_low, 1 + ε_high)). With per-sequence advantages and the paper's
    `seq-mean-token-mean` aggregation this has exactly GSPO's gradient. The paper's clip ranges are tiny
    (3e-4, 4e-4) because sᵢ is a per-token geometric mean. No dual clip.
    """
    _check_inputs(logprobs, old_logprobs, advantages, mask, rollout_is_weights)
    _check_clip(clip_low, clip_high)
    if dual_clip is not None:
        raise ValueError("GSPO has no dual clip (its sequence ratio is already bounded); leave dual_clip=None")
    logprobs, old_logprobs = _zero_padding(logprobs, old_logprobs, mask)
    valid = mask.bool()
    log_ratio = torch.where(valid, logprobs - old_logprobs, torch.zeros_like(logprobs))
    seq_log_ratio = log_ratio.sum(-1) / valid.sum(-1).clamp(min=1).to(logprobs.dtype)
    seq_ratio = torch.exp(seq_log_ratio.detach().clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)).unsqueeze(-1)
    ratio = seq_ratio * torch.exp(logprobs - logprobs.detach())
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    pg_loss = aggregate_with(_weighted(loss, rollout_is_weights), mask, agg)
    return pg_loss, _loss_metrics(log_ratio, mask, clipped=clipped > unclipped)


@register_policy_loss("gmpo", dual_clip=False, sequence_level=True)
@register_policy_loss("geo_mean", dual_clip=False, sequence_level=True)
def gmpo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.4,
    clip_high: float = 0.4,
    dual_clip: float | None = None,
    agg: str | LossAggregation = "seq-mean-token-mean",
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO: maximise the geometric mean of the token surrogates instead of their arithmetic mean, per sequence.

    With Δₜ = log π − log π_old clipped in log space to [−ε_low, ε_high] pessimistically for sign(A):
    ρ̄ᵢ = exp(meanₜ sign(A)·min(sign(A)·Δₜ, sign(A)·clip(Δₜ))), Lᵢ = −Āᵢ·ρ̄ᵢ (Āᵢ the sequence's mean advantage),
    loss = mean over sequences. The geometric mean is less sensitive to outlier token ratios, which allows a wider
    clip (paper: ε = 0.4 in log space). Zhao et al. 2025, "Geometric-Mean Policy Optimization" (arXiv 2507.20673);
    veRL `geo_mean`. The loss is per sequence, so only `seq-mean-token-mean` (with its global_seq_count) applies.
    Per-token `rollout_is_weights` have no place in a sequence-level ratio and are refused.
    """
    _check_inputs(logprobs, old_logprobs, advantages, mask, rollout_is_weights)
    if clip_low < 0 or clip_high < 0:
        raise ValueError(
            f"GMPO clips log-ratios to [−clip_low, clip_high]; both must be ≥ 0, got {clip_low}, {clip_high}"
        )
    if dual_clip is not None:
        raise ValueError("GMPO has no dual clip; leave dual_clip=None")
    if rollout_is_weights is not None:
        raise ValueError("GMPO's sequence-level ratio has no per-token weighting; use policy_loss=ppo with TIS")
    agg = LossAggregation(agg) if isinstance(agg, str) else agg
    if agg.mode != "seq-mean-token-mean":
        raise ValueError(
            f"GMPO's loss is one term per sequence; set loss_agg_mode='seq-mean-token-mean' (got {agg.mode!r})"
        )
    valid = mask.bool()
    lengths = valid.sum(-1).clamp(min=1).to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    sign = torch.sign(advantages)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(-clip_low, clip_high))
    zeros = torch.zeros_like(log_ratio)
    seq_ratio = torch.exp(torch.where(valid, pessimistic, zeros).sum(-1) / lengths)
    seq_adv = torch.where(valid, advantages, zeros).sum(-1) / lengths
    seq_loss = -seq_adv * seq_ratio
    # Put Lᵢ on each of its valid tokens: seq-mean-token-mean then gives (1/|S|)·Σᵢ Lᵢ exactly.
    per_token = torch.where(valid, seq_loss.unsqueeze(-1).expand_as(log_ratio), zeros)
    pg_loss = aggregate_with(per_token, mask, agg)
    clip_active = (sign * log_ratio) > (sign * log_ratio.clamp(-clip_low, clip_high))
    return pg_loss, _loss_metrics(log_ratio, mask, clipped=clip_active)


@register_policy_loss("cispo", dual_clip=False)
def cispo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    agg: str | LossAggregation = "token-mean",
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: L = −sg[clip(ρ, 1 − ε_low, 1 + ε_high)]·A·log π — clip the importance weight, never the gradient.

    Unlike PPO, clipped tokens still contribute a (bounded) gradient. MiniMax 2025, "MiniMax-M1" (§3.1); the paper
    effectively disables the lower bound (large ε_low) and tunes ε_high. No dual clip.
    """
    _check_inputs(logprobs, old_logprobs, advantages, mask, rollout_is_weights)
    _check_clip(clip_low, clip_high)
    if dual_clip is not None:
        raise ValueError("CISPO has no dual clip (its weight is already clipped and detached); leave dual_clip=None")
    logprobs, old_logprobs = _zero_padding(logprobs, old_logprobs, mask)
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    loss = -advantages * weight * logprobs
    pg_loss = aggregate_with(_weighted(loss, rollout_is_weights), mask, agg)
    clip_active = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
    return pg_loss, _loss_metrics(log_ratio, mask, clipped=clip_active)


@register_policy_loss("gpg", dual_clip=False)
def gpg_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str | LossAggregation = "token-mean",
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GPG: the plain policy gradient, L = −A·log π per token, with no ratio and no clip.

    Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning" (arXiv
    2504.02546); veRL's `gpg` loss mode. The gradient is −A·∇log π whatever π_old is: PPO's gradient at ρ = 1, so it
    suits one update per batch (one mini-batch, one epoch); later mini-batches or epochs are neither re-weighted
    nor bounded. clip_low/clip_high are not used; `ppo_kl` still reports how far the policy has moved.
    """
    _check_inputs(logprobs, old_logprobs, advantages, mask, rollout_is_weights)
    if dual_clip is not None:
        raise ValueError("GPG has no ratio to dual-clip; leave dual_clip=None")
    loss = -advantages * logprobs
    pg_loss = aggregate_with(_weighted(loss, rollout_is_weights), mask, agg)
    log_ratio = (logprobs - old_logprobs).detach()
    return pg_loss, _loss_metrics(log_ratio, mask)


def sapo_gate(ratio: Tensor, tau: Tensor | float) -> Tensor:
    """SAPO's soft gate f(ρ) = (4/τ)·σ(τ(ρ − 1)). Its slope 4·σ(1 − σ) is 1 at ρ = 1 and decays smoothly away from 1."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


@register_policy_loss("sapo", dual_clip=False)
def sapo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str | LossAggregation = "seq-mean-token-mean",
    rollout_is_weights: Tensor | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO: a smooth, temperature-controlled gate on the ratio instead of PPO's hard clip.

    Per token L = −A·f(ρ), f(ρ) = (4/τ)·σ(τ(ρ − 1)), ρ = π/π_old, τ = `tau_pos` where A > 0 and `tau_neg` otherwise.
    The gradient is −A·w(ρ)·∇log π with w(ρ) = 4·σ(1 − σ)·ρ: w(1) = 1 (the plain policy gradient on-policy),
    and w falls off smoothly as ρ leaves 1, so far-off-policy tokens are down-weighted rather than cut to zero.
    A larger τ makes w fall off faster. A negative advantage raises the logits of every unsampled token, so the
    paper damps those updates faster (τ_neg > τ_pos) for stability. Gao et al. 2025 (Qwen), "Soft Adaptive Policy
    Optimization" (arXiv 2511.20347): τ_pos = 1.0, τ_neg = 1.05 and the `seq-mean-token-mean` objective; veRL's
    `sapo` (actor.tau_pos / actor.tau_neg), which always aggregates as `seq-mean-token-mean`; here `agg`
    (algorithm.policy_loss.agg_mode) applies, as for every loss. clip_low/clip_high are not used; `pg_clipfrac` and
    `pg_clipfrac_lower` are 0 (nothing is clipped).
    """
    _check_inputs(logprobs, old_logprobs, advantages, mask, rollout_is_weights)
    for name, tau in (("tau_pos", tau_pos), ("tau_neg", tau_neg)):
        if not (math.isfinite(tau) and tau > 0.0):
            raise ValueError(
                f"{name} must be a finite temperature > 0 (the SAPO paper: tau_pos=1.0, tau_neg=1.05), got {tau}"
            )
    if dual_clip is not None:
        raise ValueError("SAPO has no dual clip (its gate already bounds every token's weight); leave dual_clip=None")
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    taus = torch.where(advantages > 0, ratio.new_tensor(tau_pos), ratio.new_tensor(tau_neg))  # in the ratio's dtype
    loss = -advantages * sapo_gate(ratio, taus)
    pg_loss = aggregate_with(_weighted(loss, rollout_is_weights), mask, agg)
    return pg_loss, _loss_metrics(log_ratio, mask)


def _covariance(logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Each valid token's centred product (A − mean A)(log π − mean log π), detached; the means over the valid
    tokens. Cui et al. 2025 show the entropy change is driven by this covariance."""
    valid = mask.bool()
    a, lp = advantages.detach().float(), logprobs.detach().float()
    return (a - masked_mean(a, valid)) * (lp - masked_mean(lp, valid))


@register_policy_loss("clip_cov", dual_clip=False)
def clip_cov_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    agg: str | LossAggregation = "token-mean",
    rollout_is_weights: Tensor | None = None,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    veRL's `clip_cov`): the PPO loss, with the gradient of a few high-covariance tokens cut, against entropy
    collapse. Among the valid tokens that PPO's ε-clip did not already clip and whose covariance lies strictly in
    (lb, ub), a random max(1, ⌊ratio · valid tokens⌋) get loss 0 (drawn from torch's global generator, so seeded
    runs repeat).
    Selected per call, i.e. per micro-batch, as in veRL. `pg_clipfrac` counts the cut tokens.
    """
    _check_inputs(logprobs, old_logprobs, advantages, mask, rollout_is_weights)
    _check_clip(clip_low, clip_high)
    if dual_clip is not None:
        raise ValueError("clip_cov has no dual clip; leave dual_clip=None")
    if not 0.0 < clip_cov_ratio <= 1.0:
        raise ValueError(f"clip_cov_ratio must be in (0, 1] (the paper: 0.0002), got {clip_cov_ratio}")
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    valid = mask.bool()
    cov = _covariance(logprobs, advantages, mask)
    candidates = (valid & ~(clipped > unclipped) & (cov > clip_cov_lb) & (cov < clip_cov_ub)).nonzero()
    keep = torch.ones_like(ratio)
    if len(candidates):
        count = min(max(int(clip_cov_ratio * int(valid.sum())), 1), len(candidates))
        chosen = candidates[torch.randperm(len(candidates))[:count].to(candidates.device)]
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    loss = torch.maximum(unclipped, clipped) * keep
    pg_loss = aggregate_with(_weighted(loss, rollout_is_weights), mask, agg)
    return pg_loss, _loss_metrics(log_ratio, mask, clipped=keep == 0)


@register_policy_loss("kl_cov", dual_clip=False)
def kl_cov_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    agg: str | LossAggregation = "token-mean",
    rollout_is_weights: Tensor | None = None,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov (Cui et al. 2025, veRL's `kl_cov`): the unclipped surrogate −A·ρ, plus a penalty
    `ppo_kl_coef`·|log π − log π_old| on the max(1, ⌊ratio · valid tokens⌋) tokens of highest covariance
    (A − mean A)(log π − mean log π), selected per call (micro-batch) as in veRL. There is no ratio clip
    (clip_low/clip_high are not used); `pg_clipfrac` counts the penalised tokens. `ppo_kl_coef` defaults to 1.0, the
    paper's scripts' value and veRL's fallback; veRL's config file sets 0.1.
    """
    _check_inputs(logprobs, old_logprobs, advantages, mask, rollout_is_weights)
    if dual_clip is not None:
        raise ValueError("kl_cov has no dual clip; leave dual_clip=None")
    if not 0.0 < kl_cov_ratio <= 1.0:
        raise ValueError(f"kl_cov_ratio must be in (0, 1] (the paper: 0.0002), got {kl_cov_ratio}")
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    valid = mask.bool()
    penalised = torch.zeros_like(valid)
    n_valid = int(valid.sum())
    if n_valid:
        cov = _covariance(logprobs, advantages, mask).masked_fill(~valid, float("-inf"))
        top = cov.flatten().topk(max(1, int(n_valid * kl_cov_ratio))).indices
        penalised.view(-1)[top] = True
    loss = -advantages * ratio + ppo_kl_coef * log_ratio.abs() * penalised.to(ratio.dtype)
    pg_loss = aggregate_with(_weighted(loss, rollout_is_weights), mask, agg)
    return pg_loss, _loss_metrics(log_ratio, mask, clipped=penalised)
