"""The three terms of the RL objective as sections of `algorithm`: `advantage` (which estimator and its settings),
`policy_loss` (which loss, its clip ratios and how token losses are aggregated) and `kl` (the KL to the reference,
as a loss term and/or a reward penalty). Their flat keys of earlier configs (`adv_estimator`, `clip_low`,
`use_kl_loss`, ...) are read by `migration`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlloom.core_rl.config.catalog import (
    estimator_names,
    kl_kind_problem,
    policy_loss_info,
    policy_loss_names,
    unknown_name,
)
from rlloom.core_rl.config.keys import KeyedValueError
from rlloom.core_rl.config.section import Section

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "bnpo"]


class AdvantageConfig(Section):
    """How each sample's advantage is estimated (veRL's algorithm.adv_estimator, gamma, lam and
    norm_adv_by_std_in_grpo)."""

    estimator: str = Field(
        default="grpo",
        description="Advantage estimator by registry name: gae (Schulman et al. 2016), grpo (Shao et al. 2024), "
        "dr_grpo (Liu et al. 2025), rloo (Ahmadian et al. 2024), gpg (Chu et al. 2025, veRL's), remax (Li et al. "
        "2023), reinforce_plus_plus, reinforce_plus_plus_baseline (Hu 2025).",
    )
    norm_by_std: bool = Field(default=True, description="GRPO: divide by the group std (False = Dr.GRPO).")
    epsilon: float = Field(
        default=1e-6,
        gt=0.0,
        description="GRPO's std divisor is std + epsilon (veRL: 1e-6; TRL: 1e-4), so an all-equal group gives 0.",
    )
    std_scope: Literal["group", "batch"] = Field(
        default="group",
        description="grpo with norm_by_std: divide by the std of the prompt's group, or of the whole batch's "
        "rewards (group mean, batch std: TRL's scale_rewards=batch; Liu et al. 2025, 'Tricks or Traps?').",
    )
    gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="Discount factor (GAE, REINFORCE++).")
    lam: float = Field(default=1.0, ge=0.0, le=1.0, description="GAE lambda (Schulman et al. 2016).")

    @model_validator(mode="after")
    def _check_name(self) -> AdvantageConfig:
        names = estimator_names()
        if self.estimator not in names:
            raise KeyedValueError(
                "algorithm.advantage.estimator", unknown_name("advantage estimator", self.estimator, names)
            )
        return self


class PolicyLossConfig(Section):
    """The policy-gradient loss and its settings (veRL's actor.policy_loss, clip_ratio_*, loss_agg_mode)."""

    name: str = Field(
        default="ppo",
        description="Policy loss by registry name: ppo (Schulman et al. 2017), gspo, gmpo, cispo, clip_cov, kl_cov "
        "(Cui et al. 2025), gpg (plain policy gradient, Chu et al. 2025), sapo (soft gate, Gao et al. 2025).",
    )
    kwargs: dict[str, float] = Field(
        default_factory=dict,
        description="The loss's own settings (veRL's actor.policy_loss.*, and actor.tau_pos/tau_neg), e.g. "
        "{clip_cov_ratio: 0.0002, clip_cov_lb: 1.0, clip_cov_ub: 5.0} for clip_cov, {kl_cov_ratio: 0.0002, "
        "ppo_kl_coef: 1.0} for kl_cov, {tau_pos: 1.0, tau_neg: 1.05} for sapo. Checked at load.",
    )
    clip_low: float = Field(default=0.2, ge=0.0, lt=1.0, description="PPO ratio clip below 1 (epsilon_low).")
    clip_high: float = Field(
        default=0.2, ge=0.0, description="PPO ratio clip above 1; 0.28 is DAPO's clip-higher (Yu et al. 2025)."
    )
    dual_clip: float | None = Field(
        default=None,
        gt=1.0,
        description="Dual-clip bound c for negative advantages (Ye et al. 2020); None = off (the default). veRL's "
        "vanilla loss always dual-clips with c = 3 (clip_ratio_c): set 3 for veRL's behaviour.",
    )
    agg_mode: AggMode = Field(
        default="token-mean",
        description="How token losses become a scalar (the KL and entropy terms and the critic's value loss "
        "aggregate the same way): token-mean (DAPO), seq-mean-token-mean (GRPO), seq-mean-token-sum-norm "
        "(Dr.GRPO), seq-mean-token-sum, bnpo (TRL: each micro-batch's token mean, averaged over the micro-batches "
        "of all ranks; depends on actor.max_tokens_per_micro_batch). veRL's loss_agg_mode.",
    )

    @model_validator(mode="after")
    def _check_name(self) -> PolicyLossConfig:
        names = policy_loss_names()
        if self.name not in names:
            raise KeyedValueError("algorithm.policy_loss.name", unknown_name("policy loss", self.name, names))
        return self


class KLConfig(Section):
    """The KL to the reference model: a loss term (GRPO style) and/or a penalty in the token rewards (Ziegler et
    al. 2019, InstructGPT), with its own estimator and coefficient each."""

    use_loss: bool = Field(default=False, description="Add loss_coef x KL(pi || pi_ref) to the loss (GRPO style).")
    loss_coef: float = Field(default=0.001, ge=0.0, description="Beta of the KL loss (TRL's beta).")
    loss_type: str = Field(
        default="low_var_kl",
        description="KL estimator for the loss (and the logged actor/kl_mean): k1, k2, k3/low_var_kl, abs; a `+` "
        "suffix (k3+) keeps the value and takes k2's gradient (straight-through). Schulman 2020, 'Approximating KL "
        "Divergence'.",
    )
    use_in_reward: bool = Field(
        default=False, description="Subtract reward_coef x KL from the token rewards (Ziegler et al. 2019)."
    )
    reward_type: str = Field(default="k1", description="KL estimator for the in-reward penalty.")
    controller: Literal["fixed", "adaptive"] = Field(
        default="fixed",
        description="The in-reward KL coefficient: fixed, or adaptive to a target (Ziegler et al. 2019).",
    )
    reward_coef: float = Field(default=0.001, ge=0.0, description="Initial in-reward KL coefficient.")
    target: float = Field(default=6.0, gt=0.0, description="The adaptive controller's target KL.")
    horizon: int = Field(default=10000, ge=1, description="The adaptive controller's horizon, in samples.")

    @model_validator(mode="after")
    def _check_estimators(self) -> KLConfig:
        for key in ("loss_type", "reward_type"):
            problem = kl_kind_problem(getattr(self, key))
            if problem:
                raise KeyedValueError(f"algorithm.kl.{key}", problem)
        return self

    @property
    def uses_reference(self) -> bool:
        """Whether a reference model is needed (the KL is in the loss or in the reward)."""
        return self.use_loss or self.use_in_reward


def check_policy_loss(loss: PolicyLossConfig, *, tis: bool, top_entropy_quantile: float) -> None:
    """The loss's own settings and what it supports (its traits, declared where it is registered); `tis` and
    `top_entropy_quantile` are the per-token weights the algorithm puts on the loss. Torch-free but for a loss
    given `kwargs`, which runs once on a one-token batch (`_probe`) so that a bad value fails at load."""
    name, info = loss.name, policy_loss_info(loss.name)
    unknown = sorted(set(loss.kwargs) - set(info.settings))
    if unknown:
        raise KeyedValueError(
            "algorithm.policy_loss.kwargs",
            f"{', '.join(unknown)} is not a setting of algorithm.policy_loss.name={name}; its settings: "
            f"{', '.join(info.settings) or 'none'}",
        )
    if not info.dual_clip and loss.dual_clip is not None:
        raise KeyedValueError(
            "algorithm.policy_loss.dual_clip",
            f"algorithm.policy_loss.name={name} has no dual clip (its ratio is already bounded); set "
            "algorithm.policy_loss.dual_clip=null",
        )
    if info.sequence_level:
        sequence = f"algorithm.policy_loss.name={name} has a sequence-level ratio with no per-token weights"
        if loss.agg_mode != "seq-mean-token-mean":
            raise KeyedValueError(
                "algorithm.policy_loss.agg_mode",
                f"{loss.agg_mode} but algorithm.policy_loss.name={name} has one loss term per sequence; set "
                "algorithm.policy_loss.agg_mode=seq-mean-token-mean",
            )
        if tis:
            raise KeyedValueError(
                "algorithm.tis", f"{sequence}; set algorithm.tis=null or use algorithm.policy_loss.name=ppo with TIS"
            )
        if top_entropy_quantile < 1.0:
            raise KeyedValueError(
                "algorithm.top_entropy_quantile",
                f"{sequence} to select tokens by; set algorithm.top_entropy_quantile=1.0 or use "
                "algorithm.policy_loss.name=ppo",
            )
    if loss.kwargs:
        _probe(loss)


def _probe(loss_config: PolicyLossConfig) -> None:
    """Run the loss once on a one-token batch, so that its own checks of the values in kwargs (a temperature <= 0,
    a ratio outside (0, 1]) fail at load, naming the key, rather than at the first update."""
    import torch

    from rlloom.core_rl.algorithms import get_policy_loss

    loss: Any = get_policy_loss(loss_config.name)
    one = torch.ones(1, 1)
    with torch.random.fork_rng(devices=[]):  # clip_cov draws tokens at random: leave the seeded streams alone
        try:
            loss(
                torch.zeros(1, 1),
                torch.zeros(1, 1),
                one,
                one,
                clip_low=loss_config.clip_low,
                clip_high=loss_config.clip_high,
                dual_clip=loss_config.dual_clip,
                agg=loss_config.agg_mode,
                **loss_config.kwargs,
            )
        except ValueError as err:
            raise KeyedValueError(
                "algorithm.policy_loss.kwargs", f"{err} (algorithm.policy_loss.name={loss_config.name})"
            ) from None


__all__ = ["AdvantageConfig", "AggMode", "KLConfig", "PolicyLossConfig", "check_policy_loss"]
