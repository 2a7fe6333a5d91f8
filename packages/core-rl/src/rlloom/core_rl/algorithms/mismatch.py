"""Rollout/trainer mismatch: truncated importance sampling (TIS) and the metrics that reveal the gap.

The inference engine (vLLM, SGLang) and the trainer compute log π differently (kernels, precision, batch
invariance), so "on-policy" samples are slightly off-policy. Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training" (TIS), reweight each token by min(π_train_old/π_rollout, C).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlloom.core_rl.algorithms.masked_stats import check_same_shape, masked_mean


def tis_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, cap: float) -> Tensor:
    """wₜ = min(exp(log π_old − log π_rollout), C), detached, 0 on masked tokens; pass as `rollout_is_weights`.

    Computed as exp(min(Δ, log C)) so that large ratios never overflow before the cap. Yao et al. 2025 use C = 2.
    """
    check_same_shape(old_logprobs=old_logprobs, rollout_logprobs=rollout_logprobs, mask=mask)
    if cap <= 0:
        raise ValueError(f"the TIS cap C must be > 0 (Yao et al. use 2.0), got {cap}")
    log_ratio = (old_logprobs.detach() - rollout_logprobs.detach()).float()
    weights = torch.exp(log_ratio.clamp(max=math.log(cap)))
    return torch.where(mask.bool(), weights, torch.zeros_like(weights))


def mismatch_metrics(
    old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, cap: float | None = None
) -> dict[str, Tensor]:
    """Per-step diagnostics of how far the trainer's log-probs are from the engine's (detached 0-dim tensors).

    With Δ = log π_old − log π_rollout on tokens sampled by the engine:
    `mismatch_kl_k1` = mean(−Δ) and `mismatch_kl_k3` = mean(e^Δ − Δ − 1) both estimate KL(π_rollout‖π_old);
    `mismatch_abs_logprob_diff_mean/_max` = mean/max |Δ|; `mismatch_ratio_mean` = mean e^Δ (≈ 1 when they agree);
    with `cap`, `tis_capped_frac` = fraction of tokens whose TIS weight hit C.
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
        metrics["tis_capped_frac"] = masked_mean((ratio >= cap).float(), valid)
    return metrics
