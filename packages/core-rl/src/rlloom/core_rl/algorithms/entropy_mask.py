"""Policy gradient on high-entropy tokens only (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority
Tokens Drive Effective Reinforcement Learning for LLM Reasoning", arXiv 2506.01939).

Most tokens of a reasoning trace are near-deterministic; the ~20% with high entropy are the "forking" tokens where
the model decides. Restricting the policy-gradient loss to them matched or beat full-token training on Qwen3
models. TRL exposes it as `top_entropy_quantile`; we select the tokens over the whole step's batch, from the
entropies of the old-log-prob pass, so the selection does not depend on how the batch is split into micro-batches.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def high_entropy_token_mask(entropy: Tensor, mask: Tensor, *, top_fraction: float) -> Tensor:
    """The valid tokens whose entropy is in the batch's top `top_fraction`.

    The threshold is the (1 − top_fraction) quantile of the valid tokens' entropies (linear interpolation, as
    `torch.quantile` and TRL compute it); tokens at or above it are kept. Returns a bool tensor shaped like
    `entropy`, False on masked positions.
    """
    if not 0.0 < top_fraction <= 1.0:
        raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")
    if entropy.shape != mask.shape:
        raise ValueError(f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} differ in shape")
    valid = mask.bool()
    if not bool(valid.any()):
        return valid
    values = entropy.detach().float()
    return valid & (values >= _quantile(values[valid], 1.0 - top_fraction))


def _quantile(values: Tensor, q: float) -> Tensor:
    """`torch.quantile(values, q)` (linear interpolation) for 1-D `values` of any length: torch.quantile refuses
    more than 2**24 elements, fewer valid tokens than one large step batch holds (512 prompts x 16 samples x 2k)."""
    position = q * (values.numel() - 1)
    below = math.floor(position)
    above = min(below + 1, values.numel() - 1)
    low = torch.kthvalue(values, below + 1).values
    high = torch.kthvalue(values, above + 1).values if above != below else low
    return torch.lerp(low, high, position - below)
