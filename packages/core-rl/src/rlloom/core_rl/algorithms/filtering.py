"""DAPO's sample filters: drop groups that teach nothing, keep truncated responses out of the loss.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale": dynamic sampling (§3.2)
drops prompts whose responses all got the same reward (zero group variance ⇒ zero GRPO advantage ⇒ no gradient,
only a smaller effective batch); overlong filtering (§3.3) masks the loss of truncated responses, whose reward is
noise about length rather than quality; soft overlong punishment shapes the reward near the length limit.
The refill loop ("keep sampling until the batch is full, with a cap") belongs to the trainer; these are the
pure parts it calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlloom.core_rl.algorithms.groups import GroupIds, group_index


def filter_zero_variance_groups(scores: Tensor, group_ids: GroupIds, *, keep_singletons: bool = True) -> Tensor:
    """Keep mask [B] (bool): False for every response of a group whose scores are all equal.

    A group of one has no variance to measure; it is kept by default as veRL's `filter_groups` does (with n = 1
    sampling there would otherwise be nothing left), or dropped with `keep_singletons=False`.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B] (one score per response), got shape {tuple(scores.shape)}")
    index, num_groups = group_index(group_ids, scores.shape[0], scores.device)
    x = scores.detach()
    high = torch.full((num_groups,), float("-inf"), dtype=x.dtype, device=x.device)
    low = torch.full((num_groups,), float("inf"), dtype=x.dtype, device=x.device)
    high = high.scatter_reduce(0, index, x, reduce="amax")
    low = low.scatter_reduce(0, index, x, reduce="amin")
    count = torch.zeros(num_groups, dtype=torch.long, device=x.device).index_add_(0, index, torch.ones_like(index))
    keep = high > low
    if keep_singletons:
        keep = keep | (count == 1)
    return keep[index]


def filter_groups_by_mean(scores: Tensor, group_ids: GroupIds, *, low: float, high: float) -> Tensor:
    """Keep mask [B] (bool): True for every response of a group whose mean score is strictly between `low` and
    `high` (EasyR1's online filtering, `filter_low`/`filter_high`, defaults 0.01 and 0.99: with 0/1 accuracy this
    drops the prompts the policy always or never solves; with graded rewards it keeps a difficulty band)."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B] (one score per response), got shape {tuple(scores.shape)}")
    if not low < high:
        raise ValueError(f"the band must have low < high, got low={low}, high={high}")
    index, num_groups = group_index(group_ids, scores.shape[0], scores.device)
    x = scores.detach().double()
    total = torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, index, x)
    count = torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, index, torch.ones_like(x))
    mean = total / count.clamp(min=1)
    return ((mean > low) & (mean < high))[index]


def truncated_responses(response_ids: Tensor, response_mask: Tensor, eos_token_ids: int | Sequence[int]) -> Tensor:
    """Bool [B]: True for responses whose valid tokens contain no end-of-sequence id (they hit the length limit).

    Prefer the engine's own finish reason when it reports one; this is the fallback that needs only the tokens.
    """
    if response_ids.shape != response_mask.shape or response_ids.dim() != 2:
        raise ValueError(
            "response_ids and response_mask must both be [B, T], got "
            f"{tuple(response_ids.shape)} and {tuple(response_mask.shape)}"
        )
    eos = torch.as_tensor(
        [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids), device=response_ids.device
    )
    if eos.numel() == 0:
        raise ValueError("eos_token_ids is empty; pass the tokenizer's eos id (and any other stop-token ids)")
    is_eos = torch.isin(response_ids, eos) & response_mask.bool()
    return ~is_eos.any(-1)


def mask_truncated_responses(loss_mask: Tensor, truncated: Tensor) -> Tensor:
    """DAPO overlong filtering: the loss mask with every token of a truncated response set to 0."""
    if truncated.dim() != 1 or truncated.shape[0] != loss_mask.shape[0]:
        raise ValueError(
            f"truncated must be a bool tensor [B] with B = {loss_mask.shape[0]}, got shape {tuple(truncated.shape)}"
        )
    return loss_mask * (~truncated.bool()).unsqueeze(-1).to(loss_mask.dtype)


def overlong_reward_penalty(
    response_lengths: Tensor, *, max_length: int, buffer_length: int, penalty_factor: float = 1.0
) -> Tensor:
    """DAPO soft overlong punishment, added to the reward (eq. 13), per response [B]:

    0 if |y| ≤ L_max − L_cache;  ((L_max − L_cache) − |y|) / L_cache · factor inside the buffer;  −factor beyond
    L_max. A smooth signal that "too long" is bad, instead of a cliff at the limit.
    """
    if not 0 < buffer_length <= max_length:
        raise ValueError(f"need 0 < buffer_length ≤ max_length, got buffer_length={buffer_length}, {max_length=}")
    expected = max_length - buffer_length
    excess = (response_lengths.float() - expected).clamp(min=0)
    return -(excess / buffer_length).clamp(max=1.0) * penalty_factor
