"""The critic's clipped value loss (PPO)."""

from __future__ import annotations

import torch
from torch import Tensor

from rlloom.core_rl.algorithms.aggregation import LossAggregation, aggregate_with
from rlloom.core_rl.algorithms.masked_stats import check_same_shape, masked_mean


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None,
    agg: str | LossAggregation = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """½·agg(max((V − R)², (V_clip − R)²)), V_clip = V_old + clip(V − V_old, −ε, ε); `clip=None` → ½·agg((V − R)²).

    Clipping keeps the critic near the values that produced the advantages (PPO's value clipping, as in OpenAI
    baselines and veRL). Metrics: `vf_clipfrac` (tokens where the clipped term is the larger), `vpred_mean`.
    """
    check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    if clip is not None and clip <= 0:
        raise ValueError(f"value clip must be > 0 (or None to disable), got {clip}")
    returns = returns.detach()
    unclipped = (values - returns).square()
    if clip is None:
        loss = unclipped
        clip_active = torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        old = old_values.detach()
        clipped_values = old + (values - old).clamp(-clip, clip)
        clipped = (clipped_values - returns).square()
        loss = torch.maximum(unclipped, clipped)
        clip_active = clipped > unclipped
    vf_loss = 0.5 * aggregate_with(loss, mask, agg)
    metrics = {
        "vf_clipfrac": masked_mean(clip_active.to(values.dtype), mask).detach(),
        "vpred_mean": masked_mean(values.detach(), mask),
    }
    return vf_loss, metrics
