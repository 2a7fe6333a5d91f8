"""Adaptive entropy control (Skywork-OR1, He et al. 2025, arXiv 2505.22312, "Adaptive Entropy Control").

A bang-bang controller on the entropy-bonus coefficient. With target entropy `tgt`, step Δ and ceiling `c_max`,
at training step k with measured policy entropy e_k:

    α_k     = c_k · 1{e_k < tgt}                                   (the coefficient the loss uses at step k)
    c_{k+1} = clip(c_k + Δ, 0, c_max)   if e_k < tgt
              clip(c_k − Δ, 0, c_max)   otherwise

so the bonus only acts while entropy is below the target, and it strengthens the longer entropy stays low. c_0 is
`algorithm.entropy.coef`. The rule and the defaults (tgt = 0.2, Δ = 0.001, c_max = 0.5) follow the released
Skywork-OR1 code (`EntController` in `verl/trainer/ppo/core_algos.py`, `or1_script/train/run_ds_7b.sh`). Like
`kl_control`, the controller owns one float and round-trips through `state_dict` so a resumed run continues
with the same coefficient; the two rules are also plain functions for tests and other loops.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def applied_entropy_coef(coef: float, entropy: float, *, target: float) -> float:
    """α = c · 1{entropy < target}: the entropy bonus is switched off while entropy is at or above the target."""
    return float(coef) if entropy < target else 0.0


def next_entropy_coef(coef: float, entropy: float, *, target: float, step: float, max_coef: float) -> float:
    """c' = clip(c ± Δ, 0, c_max): up by `step` when `entropy` is below `target`, down otherwise."""
    moved = coef + step if entropy < target else coef - step
    return float(min(max(moved, 0.0), max_coef))


class AdaptiveEntropyController:
    """The state of the rule above: `value` is c_k; `coef_for(e_k)` gives α_k; `update(e_k)` moves to c_{k+1}."""

    def __init__(self, init_coef: float, *, target_entropy: float, step: float, max_coef: float) -> None:
        if not (0.0 <= init_coef <= max_coef) or step <= 0 or target_entropy < 0:
            raise ValueError(
                "AdaptiveEntropyController needs 0 ≤ init_coef ≤ max_coef, step > 0 and target_entropy ≥ 0; got "
                f"{init_coef=}, {max_coef=}, {step=}, {target_entropy=}"
            )
        self.value = float(init_coef)
        self.target = float(target_entropy)
        self.step = float(step)
        self.max_coef = float(max_coef)

    def coef_for(self, entropy: float) -> float:
        """α_k: the coefficient to train step k with, given that step's measured entropy."""
        return applied_entropy_coef(self.value, entropy, target=self.target)

    def update(self, entropy: float) -> None:
        """After step k: c_{k+1} from c_k and e_k."""
        self.value = next_entropy_coef(self.value, entropy, target=self.target, step=self.step, max_coef=self.max_coef)

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "value" not in state:
            raise KeyError(f"AdaptiveEntropyController.load_state_dict: missing key 'value' (got keys {sorted(state)})")
        self.value = float(state["value"])
