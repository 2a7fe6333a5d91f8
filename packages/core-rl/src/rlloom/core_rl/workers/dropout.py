"""Dropout off for RL training: the PPO ratio compares the update's log-probs with the old-log-prob pass's.

The old log-probs are computed in eval mode, the update runs in train mode; with dropout on (GPT-2-style configs
ship with 0.1) the two passes differ by the dropout noise, so the ratio is not 1 even before the first optimizer
step, clipping fires at random and KL to the reference never reaches 0. TRL's `disable_dropout`, default on here.
"""

from __future__ import annotations

from torch import nn


def disable_dropout(model: nn.Module) -> int:
    """Set every dropout probability in `model` to 0; returns how many were non-zero.

    Covers `nn.Dropout` modules (their `p`) and the float rates attention modules keep as attributes
    (`attention_dropout` in Qwen2/Llama, read when they call `scaled_dot_product_attention` in train mode).
    """
    changed = 0
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            changed += module.p > 0
            module.p = 0.0
        for name in ("attention_dropout", "dropout"):
            rate = getattr(module, name, None)
            if isinstance(rate, float) and not isinstance(rate, bool):
                changed += rate > 0
                setattr(module, name, 0.0)
    return changed
