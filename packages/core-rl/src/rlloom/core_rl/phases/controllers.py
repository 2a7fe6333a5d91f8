"""The coefficients that move during a run: the in-reward KL coefficient (fixed or adaptive, Ziegler et al. 2019)
and the entropy bonus (fixed, or Skywork-OR1's adaptive control). Both are checkpointed by the trainer."""

from __future__ import annotations

from typing import Any

from rlloom.core_rl.algorithms import AdaptiveEntropyController, make_kl_controller
from rlloom.core_rl.algorithms.kl_control import KLController
from rlloom.core_rl.config.schema import AlgorithmConfig


def kl_controller(algo: AlgorithmConfig) -> KLController:
    """The in-reward KL coefficient's controller (always built: it is part of every checkpoint)."""
    kl = algo.kl
    return make_kl_controller(kl.controller, kl.reward_coef, target_kl=kl.target, horizon=kl.horizon)


class EntropyBonus:
    """This step's entropy-bonus weight: `algorithm.entropy.coef`, or Skywork-OR1's adaptive rule applied to the
    entropy just measured on the batch (then the controller moves for the next step)."""

    def __init__(self, algo: AlgorithmConfig) -> None:
        entropy, adaptive = algo.entropy, algo.entropy.adaptive
        self.fixed = entropy.coef
        self.controller = (
            AdaptiveEntropyController(
                entropy.coef, target_entropy=adaptive.target, step=adaptive.step, max_coef=adaptive.max_coef
            )
            if adaptive is not None
            else None
        )

    def coef(self, metrics: dict[str, float]) -> float:
        """The coefficient for this step; adds the controller's metrics to `metrics`."""
        if self.controller is None:
            return self.fixed
        if "actor/entropy" not in metrics:
            raise RuntimeError(
                "algorithm.entropy.adaptive needs the policy entropy, but the actor's compute_logprobs(entropy=True) "
                "returned none; use a PolicyWorker that computes entropies or set algorithm.entropy.adaptive=null"
            )
        entropy = metrics["actor/entropy"]
        applied = self.controller.coef_for(entropy)
        metrics["actor/entropy_coef"] = self.controller.value
        metrics["actor/entropy_coef_applied"] = applied
        self.controller.update(entropy)
        return applied

    def state_dict(self) -> dict[str, Any] | None:
        return self.controller.state_dict() if self.controller is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """A checkpoint of a run without adaptive control leaves the controller at its configured start."""
        if self.controller is not None and state is not None:
            self.controller.load_state_dict(state)
