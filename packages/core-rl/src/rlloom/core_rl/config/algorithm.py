"""The `algorithm` section: the advantage, policy-loss and KL sections (`objective`), the entropy bonus, and the
optional features (TIS, dynamic sampling, overlong punishment, a moving reference, PPO-ptx) as sections that are
absent when off, so a setting can only exist for a feature that is on. Flat keys of earlier configs are read by
`migration`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlloom.core_rl.config.keys import KeyedValueError
from rlloom.core_rl.config.migration import migrate_algorithm
from rlloom.core_rl.config.objective import AdvantageConfig, KLConfig, PolicyLossConfig, check_policy_loss
from rlloom.core_rl.config.section import Section
from rlloom.core_rl.config.streaming import OffPolicyCorrectionConfig


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
        "far (none kept: the step skips its update and logs dynamic_sampling/skipped_update); one_step_off runs the "
        "same rounds on its rollout worker. Under "
        "trainer.mode=async each group is judged as it finishes and a dropped one frees its admission slot; at most "
        "(max_rounds - 1) x data.train_batch_size groups are dropped per batch, after which groups train as they "
        "are (logged as dynamic_sampling/unfiltered_groups), so the batch stays full.",
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
    advantage: AdvantageConfig = Field(
        default_factory=AdvantageConfig, description="The advantage estimator and its settings."
    )
    policy_loss: PolicyLossConfig = Field(
        default_factory=PolicyLossConfig, description="The policy loss, its clip ratios and loss aggregation."
    )
    kl: KLConfig = Field(
        default_factory=KLConfig, description="The KL to the reference: a loss term and/or a reward penalty."
    )
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
        "them (no kl.use_in_reward, tis, top_entropy_quantile or entropy.adaptive), the update's own "
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
    off_policy_correction: OffPolicyCorrectionConfig | None = Field(
        default=None,
        description="Correction for samples of older weights (trainer.mode=async/one_step_off): none, tis or "
        "AReaL's decoupled PPO, against rollout_logprobs; None = none.",
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

    @model_validator(mode="after")
    def _check_policy_loss(self) -> AlgorithmConfig:
        weighted = self.tis is not None or self.corrects_off_policy
        check_policy_loss(self.policy_loss, tis=weighted, top_entropy_quantile=self.top_entropy_quantile)
        return self

    @property
    def uses_token_weights(self) -> bool:
        """Whether a per-token policy-gradient weight is set before the update (TIS, high-entropy selection)."""
        return self.tis is not None or self.top_entropy_quantile < 1.0 or self.corrects_off_policy

    @property
    def corrects_off_policy(self) -> bool:
        """Whether `off_policy_correction` weights tokens (tis or decoupled)."""
        return self.off_policy_correction is not None and self.off_policy_correction.method != "none"
