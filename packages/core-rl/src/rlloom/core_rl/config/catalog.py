"""The names the config may give an estimator, a policy loss and a KL estimator, known without importing torch.

The estimators and losses are torch functions registered by name in `rlloom.core_rl.algorithms`; checking a
config against those registries would load torch (seconds) before a typo could be reported. The built-in names,
the losses' traits and their own settings are listed here instead (a test compares them with the registries).
Names registered by a user's code live in the registries, whose module that code has imported, so when it is
loaded the registries answer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from rlloom.core_rl.config.naming import closest_name

KL_KINDS: dict[str, str] = {
    "k1": "k1",
    "kl": "k1",
    "k2": "k2",
    "mse": "k2",
    "k3": "k3",
    "low_var_kl": "k3",
    "abs": "abs",
}
"""Accepted KL estimator names → estimator (veRL's `kl`, `mse`, `low_var_kl` are aliases); each also with a `+`
(k2's gradient, straight-through)."""

BUILTIN_ESTIMATORS: dict[str, bool] = {
    "dr_grpo": True,
    "gae": False,
    "gpg": True,
    "grpo": True,
    "grpo_passk": True,
    "grpo_vectorized": True,
    "opo": True,
    "reinforce_plus_plus": False,
    "reinforce_plus_plus_baseline": True,
    "remax": False,
    "rloo": True,
    "rloo_vectorized": True,
}
"""Built-in advantage estimator → whether it is group-relative (its baseline is the prompt's own group)."""


@dataclass(frozen=True)
class LossInfo:
    """What a policy loss supports (as `algorithms.LossTraits`) and the names of its own settings."""

    dual_clip: bool = True
    sequence_level: bool = False
    settings: tuple[str, ...] = ()


BUILTIN_LOSSES: dict[str, LossInfo] = {
    "cispo": LossInfo(dual_clip=False),
    "clip_cov": LossInfo(dual_clip=False, settings=("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")),
    "geo_mean": LossInfo(dual_clip=False, sequence_level=True),
    "gmpo": LossInfo(dual_clip=False, sequence_level=True),
    "gpg": LossInfo(dual_clip=False),
    "gspo": LossInfo(dual_clip=False),
    "kl_cov": LossInfo(dual_clip=False, settings=("kl_cov_ratio", "ppo_kl_coef")),
    "ppo": LossInfo(),
    "sapo": LossInfo(dual_clip=False, settings=("tau_pos", "tau_neg")),
}

_ESTIMATORS_MODULE = "rlloom.core_rl.algorithms.estimators"
_LOSSES_MODULE = "rlloom.core_rl.algorithms.policy_loss"


def estimator_names() -> list[str]:
    """Every advantage estimator name a config may give (the registry's once loaded: it has user ones too)."""
    if _ESTIMATORS_MODULE in sys.modules:
        return list(sys.modules[_ESTIMATORS_MODULE].ADVANTAGE_ESTIMATORS.names())
    return sorted(BUILTIN_ESTIMATORS)


def is_group_relative(name: str) -> bool:
    """Whether the estimator compares each sample with its prompt's group (needs rollout.n >= 2)."""
    if _ESTIMATORS_MODULE in sys.modules:
        return name in sys.modules[_ESTIMATORS_MODULE].GROUP_RELATIVE_ESTIMATORS
    return BUILTIN_ESTIMATORS.get(name, False)


def policy_loss_names() -> list[str]:
    """Every policy loss name a config may give (the registry's once loaded)."""
    if _LOSSES_MODULE in sys.modules:
        return list(sys.modules[_LOSSES_MODULE].POLICY_LOSSES.names())
    return sorted(BUILTIN_LOSSES)


def policy_loss_info(name: str) -> LossInfo:
    """Traits and own settings of a known loss (`name` must be one of `policy_loss_names()`)."""
    if _LOSSES_MODULE not in sys.modules:
        return BUILTIN_LOSSES[name]
    import inspect

    module = sys.modules[_LOSSES_MODULE]
    traits = module.policy_loss_traits(name)
    own = inspect.signature(module.get_policy_loss(name)).parameters
    settings = tuple(n for n in own if n not in module.STANDARD_LOSS_ARGUMENTS)
    return LossInfo(dual_clip=traits.dual_clip, sequence_level=traits.sequence_level, settings=settings)


def kl_kind_problem(kind: str) -> str | None:
    """None for a valid KL estimator name (k1, k3+, low_var_kl, ...), else the error with the nearest name."""
    base = kind[:-1] if kind.endswith("+") else kind
    if base in KL_KINDS:
        return None
    return unknown_name("KL estimator", kind, [*KL_KINDS, *(f"{k}+" for k in KL_KINDS)])


def unknown_name(kind: str, name: str, valid: list[str]) -> str:
    """`unknown <kind> 'x'; did you mean 'y'? Valid names: ...`."""
    close = closest_name(name, valid)
    hint = f"; did you mean {close!r}?" if close else ""
    return f"unknown {kind} {name!r}{hint} Valid names: {', '.join(sorted(valid))}."


__all__ = [
    "BUILTIN_ESTIMATORS",
    "BUILTIN_LOSSES",
    "KL_KINDS",
    "LossInfo",
    "estimator_names",
    "is_group_relative",
    "kl_kind_problem",
    "policy_loss_info",
    "policy_loss_names",
    "unknown_name",
]
