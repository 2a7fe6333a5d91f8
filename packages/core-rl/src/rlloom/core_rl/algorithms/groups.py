"""Group statistics over the responses sampled from the same prompt (GRPO, RLOO, DAPO filtering).

Vectorised with `index_add_`/`scatter_reduce`, so the cost does not grow with a Python loop over groups; group
ids may be integer tensors or any hashables (veRL's string `uid`s).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import torch
from torch import Tensor

GroupIds: TypeAlias = Tensor | Sequence[Hashable] | np.ndarray[Any, Any]
"""One id per sample: a 1-D integer tensor or a sequence of hashables (e.g. uid strings)."""


def group_index(group_ids: GroupIds, batch_size: int, device: torch.device | str = "cpu") -> tuple[Tensor, int]:
    """Map arbitrary group ids to contiguous integers 0..G-1 (in order of first appearance for hashables).

    Returns `(index[B] long, G)`.
    """
    if isinstance(group_ids, Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D (one id per sample), got shape {tuple(group_ids.shape)}")
        if group_ids.is_floating_point():
            raise ValueError("group_ids must be integer ids or hashables, got a floating-point tensor")
        _, index = torch.unique(group_ids, return_inverse=True)
        ids_len = group_ids.shape[0]
        index = index.to(device=device, dtype=torch.long)
    else:
        if isinstance(group_ids, np.ndarray):
            group_ids = group_ids.tolist()
        if isinstance(group_ids, str | bytes):
            raise ValueError("group_ids must be a sequence of ids, one per sample, not a single string")
        mapping: dict[Hashable, int] = {}
        positions = [mapping.setdefault(g, len(mapping)) for g in group_ids]
        ids_len = len(positions)
        index = torch.tensor(positions, dtype=torch.long, device=device)
    if ids_len != batch_size:
        raise ValueError(f"group_ids has {ids_len} entries but the batch has {batch_size} samples; pass one per sample")
    num_groups = int(index.max().item()) + 1 if ids_len else 0
    return index, num_groups


@dataclass(frozen=True)
class GroupStats:
    """Per-sample view of its group's statistics (each tensor has shape [B])."""

    index: Tensor
    count: Tensor
    mean: Tensor
    std: Tensor
    """Sample standard deviation with Bessel's correction (as `torch.std`); 0 for groups of one."""


def group_stats(scores: Tensor, group_ids: GroupIds) -> GroupStats:
    """Mean, Bessel-corrected std and size of each sample's group, gathered back to [B]."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B] (one score per response), got shape {tuple(scores.shape)}")
    index, num_groups = group_index(group_ids, scores.shape[0], scores.device)
    dtype = torch.promote_types(scores.dtype, torch.float32)
    x = scores.detach().to(dtype)
    count = torch.zeros(num_groups, dtype=dtype, device=x.device).index_add_(0, index, torch.ones_like(x))
    total = torch.zeros(num_groups, dtype=dtype, device=x.device).index_add_(0, index, x)
    mean = total / count
    centred = x - mean[index]
    sq = torch.zeros(num_groups, dtype=dtype, device=x.device).index_add_(0, index, centred * centred)
    var = torch.where(count > 1, sq / (count - 1).clamp(min=1), torch.zeros_like(sq))
    return GroupStats(index=index, count=count[index], mean=mean[index], std=var.sqrt()[index])
