"""Rollout/trainer mismatch: truncated importance sampling (TIS) and the metrics that reveal the gap.

The inference engine (vLLM, SGLang) and the trainer compute log π differently (kernels, precision, batch
invariance), so "on-policy" samples are slightly off-policy. Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training" (TIS), reweight each token by min(π_train_old/π_rollout, C).
TRL's `vllm_importance_sampling_mode` adds the variants `TIS_MODES` names: the ratio per token or per sequence
(the product over its sampled tokens), truncated at C or, above C, masked to 0 (the sample is dropped).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlloom.core_rl.algorithms.masked_stats import check_same_shape, masked_mean

TIS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""Which ratio (each token's, or its sequence's product) and what happens above the cap (truncate to C, mask to 0)."""


def importance_log_ratios(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, mode: str) -> Tensor:
    """Δ = log π_old − log π_rollout per token, or (sequence modes) its sum over the sequence's sampled tokens on
    every token of that sequence; detached, float32."""
    if mode not in TIS_MODES:
        raise ValueError(f"unknown TIS mode {mode!r}; valid modes: {', '.join(TIS_MODES)}")
    delta = (old_logprobs.detach() - rollout_logprobs.detach()).float()
    if mode.startswith("sequence"):
        delta = torch.where(mask.bool(), delta, torch.zeros_like(delta)).sum(-1, keepdim=True).expand_as(delta)
    return delta


def tis_weights(
    old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, cap: float, mode: str = "token_truncate"
) -> Tensor:
    """Importance weights π_old/π_rollout, detached, 0 on masked tokens; pass as `rollout_is_weights`.

    token_truncate (Yao et al. 2025, who use C = 2): wₜ = min(ratioₜ, C). token_mask: ratioₜ, or 0 where it
    exceeds C. sequence_truncate / sequence_mask: the same with the sequence's ratio exp(Σₜ Δₜ) on all of its
    tokens. Computed from exp(min(Δ, log C)), so large ratios never overflow.
    """
    check_same_shape(old_logprobs=old_logprobs, rollout_logprobs=rollout_logprobs, mask=mask)
    if cap <= 0:
        raise ValueError(f"the TIS cap C must be > 0 (Yao et al. use 2.0), got {cap}")
    log_ratio = importance_log_ratios(old_logprobs, rollout_logprobs, mask, mode=mode)
    log_cap = math.log(cap)
    weights = torch.exp(log_ratio.clamp(max=log_cap))
    if mode.endswith("mask"):
        weights = torch.where(log_ratio > log_cap, torch.zeros_like(weights), weights)
    return torch.where(mask.bool(), weights, torch.zeros_like(weights))


OFF_POLICY_MODES = {"tis": "token_truncate", "decoupled": "token_mask"}
"""`algorithm.off_policy_correction.method` → the TIS mode that computes its per-token weight."""


def off_policy_weights(
    proximal_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, *, method: str, cap: float
) -> Tensor:
    """Per-token weights of the loss for samples drawn by older weights (pass as `rollout_is_weights`).

    decoupled (AReaL, Fu et al. 2025, §5.2): the PPO ratio is clipped against the proximal policy (the
    log-probs recomputed before the update: the trainer's old log-probs) and each token is weighted by
    pi_prox/pi_behav, the behaviour policy being the engine that sampled it; tokens whose weight exceeds `cap`
    are dropped (AReaL's behav_imp_weight_cap). tis: the same weight truncated at `cap` (Yao et al. 2025)."""
    if method not in OFF_POLICY_MODES:
        raise ValueError(f"unknown off-policy correction {method!r}; valid: {', '.join(OFF_POLICY_MODES)}")
    return tis_weights(proximal_logprobs, behaviour_logprobs, mask, cap=cap, mode=OFF_POLICY_MODES[method])


def mismatch_metrics(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    *,
    cap: float | None = None,
    mode: str = "token_truncate",
) -> dict[str, Tensor]:
    """Per-step diagnostics of how far the trainer's log-probs are from the engine's (detached 0-dim tensors).

    With Δ = log π_old − log π_rollout on tokens sampled by the engine:
    `mismatch_kl_k1` = mean(−Δ) and `mismatch_kl_k3` = mean(e^Δ − Δ − 1) both estimate KL(π_rollout‖π_old);
    `mismatch_abs_logprob_diff_mean/_max` = mean/max |Δ|; `mismatch_ratio_mean` = mean e^Δ (≈ 1 when they agree);
    with `cap`, `tis_capped_frac` = the fraction of tokens (token modes) or of sequences (sequence modes) whose
    ratio reached C, so were truncated or masked.
    """
    check_same_shape(old_logprobs=old_logprobs, rollout_logprobs=rollout_logprobs, mask=mask)
    valid = mask.bool()
    delta = (old_logprobs.detach() - rollout_logprobs.detach()).float()
    ratio = torch.exp(delta.clamp(max=20.0))
    abs_delta = delta.abs()
    metrics = {
        "mismatch_kl_k1": masked_mean(-delta, valid),
        "mismatch_kl_k3": masked_mean(ratio - delta - 1.0, valid),
        "mismatch_abs_logprob_diff_mean": masked_mean(abs_delta, valid),
        "mismatch_abs_logprob_diff_max": torch.where(valid, abs_delta, torch.zeros_like(abs_delta)).max()
        if abs_delta.numel()
        else abs_delta.new_zeros(()),
        "mismatch_ratio_mean": masked_mean(ratio, valid),
    }
    if cap is not None:
        over = importance_log_ratios(old_logprobs, rollout_logprobs, mask, mode=mode) >= math.log(cap)
        if mode.startswith("sequence"):  # every token of a sequence holds its ratio: count each sequence once
            metrics["tis_capped_frac"] = masked_mean((over & valid).any(-1).float(), valid.any(-1))
        else:
            metrics["tis_capped_frac"] = masked_mean(over.float(), valid)
    return metrics
