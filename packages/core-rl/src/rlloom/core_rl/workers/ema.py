"""An exponential moving average of the policy's weights (OpenRLHF's `--enable_ema`, `--ema_beta`).

RL updates are noisy; the average of the recent policies is often a better final model than the last one. The
shadow starts as the initial weights and after each step moves ema ← β·ema + (1 − β)·θ. It is checkpointed with
the run (so a resume continues the same average) and saved next to each checkpoint's model as `ema/`, a Hugging
Face folder that loads like the model itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch
from torch import nn


class WeightEMA:
    """A float32 shadow of `module`'s parameters, kept on `device` (CPU by default, off the accelerator)."""

    def __init__(self, module: nn.Module, beta: float, device: str | torch.device = "cpu") -> None:
        if not 0.0 < beta < 1.0:
            raise ValueError(f"the EMA decay beta must be in (0, 1) (OpenRLHF: 0.992), got {beta}")
        self.beta = beta
        self.device = torch.device(device)
        self.shadow = {
            name: p.detach().to(self.device, torch.float32, copy=True) for name, p in module.named_parameters()
        }

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        """ema ← β·ema + (1 − β)·θ for every parameter of `module` (the same names as at construction)."""
        for name, p in module.named_parameters():
            self.shadow[name].mul_(self.beta).add_(p.detach().to(self.device, torch.float32), alpha=1.0 - self.beta)

    @contextlib.contextmanager
    def applied(self, module: nn.Module) -> Iterator[nn.Module]:
        """`module` with the averaged weights inside the block (e.g. to save it), its own weights restored after."""
        own = {name: p.detach().clone() for name, p in module.named_parameters()}
        try:
            with torch.no_grad():
                for name, p in module.named_parameters():
                    p.copy_(self.shadow[name].to(p.device, p.dtype))
            yield module
        finally:
            with torch.no_grad():
                for name, p in module.named_parameters():
                    p.copy_(own[name])

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        missing = sorted(set(self.shadow) - set(state))
        if missing:
            raise KeyError(f"the saved EMA lacks {len(missing)} parameters, e.g. {missing[0]!r}")
        self.shadow = {name: state[name].to(self.device, torch.float32) for name in self.shadow}
