"""KL coefficient controllers for KL-in-reward: fixed, or adaptive toward a target KL (Ziegler et al. 2019).

One of the two stateful pieces of the algorithms package (with `entropy_control`); it owns one float and
round-trips through `state_dict` so a resumed run continues with the same coefficient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol


class KLController(Protocol):
    """What the trainer needs: the current β, an update after each step, and checkpointing."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def _load_value(state: Mapping[str, Any], owner: str) -> float:
    if "value" not in state:
        raise KeyError(f"{owner}.load_state_dict: missing key 'value' (got keys {sorted(state)})")
    return float(state["value"])


class FixedKLController:
    """β stays at `kl_coef`."""

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be ≥ 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.value = _load_value(state, "FixedKLController")


class AdaptiveKLController:
    """Proportional controller: β ← β·(1 + clip(KL/target − 1, −0.2, 0.2)·n_steps/horizon).

    `n_steps` is the number of samples in the batch just trained on and `horizon` is in samples (Ziegler et al.
    2019, "Fine-Tuning Language Models from Human Preferences", §2.2, use horizon 10,000), so β moves by at most
    20% per horizon's worth of samples, up when KL overshoots the target and down when it undershoots.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if init_kl_coef < 0 or target_kl <= 0 or horizon <= 0:
            raise ValueError(
                "AdaptiveKLController needs init_kl_coef ≥ 0, target_kl > 0, horizon > 0; got "
                f"{init_kl_coef=}, {target_kl=}, {horizon=}"
            )
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.value = _load_value(state, "AdaptiveKLController")
        self.target = float(state.get("target", self.target))
        self.horizon = int(state.get("horizon", self.horizon))


def make_kl_controller(
    kind: Literal["fixed", "adaptive"], kl_coef: float, *, target_kl: float | None = None, horizon: int | None = None
) -> FixedKLController | AdaptiveKLController:
    """Build the controller a config names; `adaptive` needs `target_kl` and `horizon`."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("an adaptive KL controller needs target_kl and horizon (Ziegler et al.: 6.0, 10000)")
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller {kind!r}; valid: 'fixed', 'adaptive'")
