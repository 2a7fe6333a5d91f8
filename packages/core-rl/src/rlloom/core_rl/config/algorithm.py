"""The `algorithm` section: advantage estimator, policy loss and its settings, KL, entropy bonus, and the optional
features (TIS, dynamic sampling, overlong punishment, a moving reference, PPO-ptx) as sections that are absent when
off, so a setting can only exist for a feature that is on. Flat keys of earlier configs are read by
`config_migration`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, model_validator

from rlloom.core_rl.config.keys import KeyedValueError
from rlloom.core_rl.config.migration import migrate_algorithm
from rlloom.core_rl.config.section import Section


class TISConfig(Section):
    cap: float = Field(
        gt=0.0,
        description="Truncated importance sampling cap C: weight tokens by min(pi_old/pi_rollout, C) to correct the "
        "engine/trainer mismatch (Yao et al. 2025; TRL's vllm_importance_sampling_cap, veRL's rollout_is_threshold). "
        "The mismatch KL is logged whether or not TIS is on.",
    )
    mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = Field(
        default="token_truncate",
        description="TRL's vllm_importance_sampling_mode: the ratio per token or per sequence (the product over its "
        "sampled tokens), truncated at the cap or, above it, masked to 0 (the sample drops out).",
    )


class DynamicSamplingConfig(Section):
    """DAPO dynamic sampling (Yu et al. 2025): drop groups whose rewards all agree and sample more prompts until
    the batch is full."""

    filter_band: tuple[float, float] | None = Field(
        default=None,
        description="Keep the groups whose mean score is strictly inside (low, high) instead of those whose scores "
        "differ (EasyR1's online filtering: filter_low/filter_high, e.g. [0.01, 0.99]). None = DAPO's rule.",
    )
    filter_key: str | None = Field(
        default=None,
        description="The reward component groups are judged by (e.g. accuracy, so a format bonus alone keeps no "
        "group; EasyR1's filter_key); None = the reward without the overlong penalty.",
    )
    max_rounds: int = Field(
        default=3,
        ge=1,
        description="Cap on rollout rounds per step (veRL's max_num_gen_batches), then train on the groups kept so "
        "far (none kept: the step skips its update and logs dynamic_sampling/skipped_update).",
    )

    @model_validator(mode="after")
    def _check_band(self) -> DynamicSamplingConfig:
        if self.filter_band is not None and not self.filter_band[0] < self.filter_band[1]:
            raise KeyedValueError(
                "algorithm.dynamic_sampling.filter_band",
                f"{list(self.filter_band)} is empty; give [low, high] with low < high (EasyR1: [0.01, 0.99])",
            )
        return self


class OverlongConfig(Section):
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13)."""

    buffer: int = Field(
        ge=1,
        description="A training reward penalty grows linearly from 0 to -penalty_factor over the last `buffer` "
        "tokens before the response limit (the step's max_tokens; DAPO: 4096 of 20480). Validation rewards are never "
        "penalised.",
    )
    penalty_factor: float = Field(default=1.0, ge=0.0, description="Largest punishment (DAPO: 1.0).")


class AdaptiveEntropyConfig(Section):
    """Skywork-OR1's adaptive entropy control (He et al. 2025, arXiv 2505.22312): the bonus applies only while the
    policy entropy is below `target`, and its coefficient moves by `step` after every step (up while entropy <
    target, down otherwise), clipped to [0, max_coef]; `entropy.coef` is its starting value. The defaults are those
    of every released training script (or1_scripts/train/{7b,32b}_{8k,16k,32k}.sh: init 0, target 0.2, max 0.005,
    delta 1e-4); before issue 29 they were step 0.001 and max_coef 0.5."""

    target: float = Field(default=0.2, ge=0.0, description="Target entropy, nats per token (Skywork-OR1: 0.2).")
    step: float = Field(default=1e-4, gt=0.0, description="Coefficient change per step (Skywork-OR1: 1e-4).")
    max_coef: float = Field(default=0.005, ge=0.0, description="Ceiling of the coefficient (Skywork-OR1: 0.005).")


class EntropyConfig(Section):
    coef: float = Field(
        default=0.0,
        ge=0.0,
        description="Entropy bonus weight (subtracted from the loss; veRL's entropy_coeff); with `adaptive`, its "
        "starting value.",
    )
    adaptive: AdaptiveEntropyConfig | None = Field(
        default=None, description="Adaptive entropy control ({} for Skywork-OR1's defaults); None = a fixed coef."
    )

    @model_validator(mode="after")
    def _check_start(self) -> EntropyConfig:
        if self.adaptive is not None and self.coef > self.adaptive.max_coef:
            raise KeyedValueError(
                "algorithm.entropy.coef",
                f"{self.coef} is the starting coefficient of adaptive entropy control and must not exceed "
                f"algorithm.entropy.adaptive.max_coef={self.adaptive.max_coef}; lower the one or raise the other",
            )
        return self


class RefSyncConfig(Section):
    """Move the reference model toward the policy: ref = alpha * policy + (1 - alpha) * ref (TR-DPO's soft update,
    Gorbatovski et al. 2024; TRL's sync_ref_model), so the KL anchor follows a long run."""

    every: int = Field(ge=1, description="Training steps between updates (TRL's ref_model_sync_steps; 512 there).")
    alpha: float = Field(default=0.6, gt=0.0, le=1.0, description="alpha of the update (1.0 copies; TRL: 0.6).")


class PtxConfig(Section):
    """PPO-ptx (InstructGPT's gamma, Ouyang et al. 2022; OpenRLHF's --ptx_coef and --pretrain_data): every actor
    optimizer step adds coef x the language-model NLL of a batch of `files` rows, so the policy keeps its
    supervised/pretraining distribution."""

    coef: float = Field(gt=0.0, description="Weight of the LM loss (OpenRLHF's default: 0.05).")
    files: list[str] = Field(
        min_length=1,
        description="JSONL files (.gz too) of supervised or pretraining rows: {text: ...} trains every token of the "
        "text, {prompt: messages or string, response: ...} the response and EOS after the chat-templated prompt, as "
        "the SFT warm-up does.",
    )
    batch_size: int = Field(
        default=8,
        ge=1,
        description="Rows per actor optimizer step, cycled epoch by epoch (reshuffled with data.shuffle).",
    )
    max_length: int = Field(
        default=1024,
        ge=2,
        description="Rows are cut to this many tokens, prompt included (OpenRLHF: prompt + generate max len).",
    )


class AlgorithmConfig(Section):
    adv_estimator: str = Field(
        default="grpo",
        description="Advantage estimator by registry name: gae (Schulman et al. 2016), grpo (Shao et al. 2024), "
        "dr_grpo (Liu et al. 2025), rloo (Ahmadian et al. 2024), gpg (Chu et al. 2025, veRL's), remax (Li et al. "
        "2023), reinforce_plus_plus, reinforce_plus_plus_baseline (Hu 2025).",
    )
    norm_adv_by_std: bool = Field(default=True, description="GRPO: divide by the group std (False = Dr.GRPO).")
    adv_epsilon: float = Field(
        default=1e-6,
        gt=0.0,
        description="GRPO's std divisor is std + adv_epsilon (veRL: 1e-6; TRL: 1e-4), so an all-equal group gives 0.",
    )
    adv_std_scope: Literal["group", "batch"] = Field(
        default="group",
        description="grpo with norm_adv_by_std: divide by the std of the prompt's group, or of the whole batch's "
        "rewards (group mean, batch std: TRL's scale_rewards=batch; Liu et al. 2025, 'Tricks or Traps?').",
    )
    gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="Discount factor (GAE, REINFORCE++).")
    lam: float = Field(default=1.0, ge=0.0, le=1.0, description="GAE lambda (Schulman et al. 2016).")
    policy_loss: str = Field(
        default="ppo",
        description="Policy loss by registry name: ppo (Schulman et al. 2017), gspo, gmpo, cispo, clip_cov, kl_cov "
        "(Cui et al. 2025), gpg (plain policy gradient, Chu et al. 2025), sapo (soft gate, Gao et al. 2025).",
    )
    policy_loss_kwargs: dict[str, float] = Field(
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
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "bnpo"
    ] = Field(
        default="token-mean",
        description="How token losses become a scalar: token-mean (DAPO), seq-mean-token-mean (GRPO), "
        "seq-mean-token-sum-norm (Dr.GRPO), seq-mean-token-sum, bnpo (TRL: each micro-batch's token mean, "
        "averaged over the micro-batches of all ranks; depends on actor.max_tokens_per_micro_batch).",
    )
    use_kl_loss: bool = Field(default=False, description="Add beta x KL(pi || pi_ref) to the loss (GRPO style).")
    kl_loss_coef: float = Field(default=0.001, ge=0.0, description="Beta of the KL loss.")
    kl_loss_type: str = Field(
        default="low_var_kl",
        description="KL estimator for the loss: k1, k2, k3/low_var_kl, abs; a `+` suffix (k3+) keeps the value "
        "and takes k2's gradient (straight-through). Schulman 2020, 'Approximating KL Divergence'.",
    )
    use_kl_in_reward: bool = Field(
        default=False, description="Subtract beta x KL from the token rewards (Ziegler et al. 2019, InstructGPT)."
    )
    kl_in_reward_type: str = Field(default="k1", description="KL estimator for the in-reward penalty.")
    kl_controller: Literal["fixed", "adaptive"] = Field(
        default="fixed", description="In-reward KL coefficient: fixed, or adaptive to a target (Ziegler et al.)."
    )
    kl_coef: float = Field(default=0.001, ge=0.0, description="Initial in-reward KL coefficient.")
    target_kl: float = Field(default=6.0, gt=0.0, description="Adaptive controller target KL.")
    kl_horizon: int = Field(default=10000, ge=1, description="Adaptive controller horizon.")
    top_entropy_quantile: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="Policy gradient only on the tokens whose entropy is in this top fraction of the step's batch "
        "(Wang et al. 2025 keep 0.2; TRL's key); 1.0 = every token. The KL and entropy terms still cover all tokens.",
    )
    old_logprobs: Literal["auto", "recompute"] = Field(
        default="auto",
        description="Where the PPO ratio's old log-probs come from. auto: when the step makes exactly one "
        "optimizer step (actor.ppo_epochs 1, the batch within one mini-batch) and nothing before the update needs "
        "them (no use_kl_in_reward, tis, top_entropy_quantile or entropy.adaptive), the update's own "
        "log-probs, detached, are the old ones (ratio 1, as TRL's GRPOTrainer does), saving a forward pass per "
        "step; otherwise, and with "
        "recompute, a separate forward computes them before the update.",
    )
    entropy: EntropyConfig = Field(
        default_factory=EntropyConfig, description="The entropy bonus: a fixed coefficient or adaptive control."
    )
    tis: TISConfig | None = Field(
        default=None, description="Truncated importance sampling against the rollout engine's log-probs; None = off."
    )
    dynamic_sampling: DynamicSamplingConfig | None = Field(
        default=None, description="DAPO dynamic sampling ({} for the defaults); None = off."
    )
    overlong_filter: bool = Field(
        default=False, description="DAPO overlong filtering: truncated responses carry no loss (Yu et al. 2025)."
    )
    overlong: OverlongConfig | None = Field(
        default=None, description="DAPO's soft overlong punishment of long responses; None = off."
    )
    ref_sync: RefSyncConfig | None = Field(
        default=None, description="A reference model that follows the policy; None = a fixed reference."
    )
    ptx: PtxConfig | None = Field(default=None, description="PPO-ptx: an LM loss on supervised rows; None = off.")

    @model_validator(mode="before")
    @classmethod
    def _read_flat_keys(cls, data: Any) -> Any:
        """Configs written for the flat keys (`tis_cap`, `dynamic_sampling: true`, ...) load with a hint."""
        return migrate_algorithm(data) if isinstance(data, dict) else data

    @property
    def uses_token_weights(self) -> bool:
        """Whether a per-token policy-gradient weight is set before the update (TIS, high-entropy selection)."""
        return self.tis is not None or self.top_entropy_quantile < 1.0


def check_policy_loss(algo: AlgorithmConfig) -> None:
    """The loss's own settings and what it supports (`LossTraits`, declared where the loss is registered)."""
    from rlloom.core_rl.algorithms import STANDARD_LOSS_ARGUMENTS, get_policy_loss, policy_loss_traits

    loss = algo.policy_loss
    if algo.policy_loss_kwargs:
        own = [n for n in inspect.signature(get_policy_loss(loss)).parameters if n not in STANDARD_LOSS_ARGUMENTS]
        unknown = sorted(set(algo.policy_loss_kwargs) - set(own))
        if unknown:
            raise KeyedValueError(
                "algorithm.policy_loss_kwargs",
                f"{', '.join(unknown)} is not a setting of algorithm.policy_loss={loss}; its settings: "
                f"{', '.join(own) or 'none'}",
            )
    traits = policy_loss_traits(loss)
    if not traits.dual_clip and algo.dual_clip is not None:
        raise KeyedValueError(
            "algorithm.dual_clip",
            f"algorithm.policy_loss={loss} has no dual clip (its ratio is already bounded); set "
            "algorithm.dual_clip=null",
        )
    if traits.sequence_level:
        sequence = f"algorithm.policy_loss={loss} has a sequence-level ratio with no per-token weights"
        if algo.loss_agg_mode != "seq-mean-token-mean":
            raise KeyedValueError(
                "algorithm.loss_agg_mode",
                f"{algo.loss_agg_mode} but algorithm.policy_loss={loss} has one loss term per sequence; set "
                "algorithm.loss_agg_mode=seq-mean-token-mean",
            )
        if algo.tis is not None:
            raise KeyedValueError(
                "algorithm.tis", f"{sequence}; set algorithm.tis=null or use algorithm.policy_loss=ppo with TIS"
            )
        if algo.top_entropy_quantile < 1.0:
            raise KeyedValueError(
                "algorithm.top_entropy_quantile",
                f"{sequence} to select tokens by; set algorithm.top_entropy_quantile=1.0 or use "
                "algorithm.policy_loss=ppo",
            )
    if algo.policy_loss_kwargs:
        _probe_policy_loss(algo)


def _probe_policy_loss(algo: AlgorithmConfig) -> None:
    """Run the loss once on a one-token batch, so that its own checks of the values in policy_loss_kwargs (a
    temperature <= 0, a ratio outside (0, 1]) fail at load, naming the key, rather than at the first update."""
    import torch

    from rlloom.core_rl.algorithms import get_policy_loss

    loss: Callable[..., Any] = get_policy_loss(algo.policy_loss)
    one = torch.ones(1, 1)
    with torch.random.fork_rng(devices=[]):  # clip_cov draws tokens at random: leave the seeded streams alone
        try:
            loss(
                torch.zeros(1, 1),
                torch.zeros(1, 1),
                one,
                one,
                clip_low=algo.clip_low,
                clip_high=algo.clip_high,
                dual_clip=algo.dual_clip,
                agg=algo.loss_agg_mode,
                **algo.policy_loss_kwargs,
            )
        except ValueError as err:
            raise KeyedValueError(
                "algorithm.policy_loss_kwargs", f"{err} (algorithm.policy_loss={algo.policy_loss})"
            ) from None
