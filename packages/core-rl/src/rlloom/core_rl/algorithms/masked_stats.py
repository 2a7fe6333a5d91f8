"""Statistics over the valid (mask = 1) entries of a padded tensor: mean, variance, whitening."""

from __future__ import annotations

import torch
from torch import Tensor


def check_same_shape(**tensors: Tensor) -> None:
    """Raise naming the fields when tensors that must align token by token do not."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listing = ", ".join(f"{name}{shape}" for name, shape in shapes.items())
        raise ValueError(f"these tensors must have the same shape: {listing}")


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ values·mask, with masked entries replaced by 0 (so inf/nan padding never leaks in)."""
    kept = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ values·mask / Σ mask (0 where nothing is valid rather than nan)."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def masked_var(values: Tensor, mask: Tensor, *, unbiased: bool = True) -> Tensor:
    """Variance over the valid entries; `unbiased` applies Bessel's correction n/(n−1) as veRL does."""
    n = mask.bool().sum()
    if unbiased and int(n) < 2:
        raise ValueError(f"the unbiased masked variance needs at least 2 valid entries, got {int(n)}")
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    return var * n / (n - 1) if unbiased else var


def masked_whiten(values: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x − mean) / sqrt(var + eps) over the valid entries of the whole tensor; masked entries become 0.

    The batch whitening of PPO advantages (and REINFORCE++'s global normalisation). Variance is Bessel-corrected
    like veRL's `masked_whiten`; `shift_mean=False` keeps the original mean (only rescales).
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros((), dtype=whitened.dtype, device=whitened.device))
