"""Every advantage estimator and loss of rlloom as pure tensor functions, selected by name.

Modules: `advantages` (GRPO, Dr.GRPO, GRPO pass@k, RLOO, OPO, GPG, ReMax, GAE, REINFORCE++), `estimators` (the name
registry over them), `policy_loss` (PPO clip / clip-higher / dual clip, GSPO, GMPO, CISPO, GPG, SAPO, Clip-Cov,
KL-Cov), `value_loss`, `aggregation` (loss_agg_mode), `kl` (k1/k2/k3/abs and straight-through, KL-in-reward),
`kl_control`, `entropy_control` (Skywork-OR1 adaptive entropy coefficient), `logits` (chunked log-probs and
entropy), `mismatch` (TIS and rollout/trainer mismatch metrics), `filtering` (DAPO dynamic sampling and overlong
filters). Tensors in, tensors out; the trainer owns all state.
"""

from rlloom.core_rl.algorithms.advantages import (
    discounted_returns,
    gae_advantages,
    gpg_advantages,
    grpo_advantages,
    grpo_passk_advantages,
    opo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
    rloo_advantages,
)
from rlloom.core_rl.algorithms.aggregation import (
    AGG_MODES,
    AggMode,
    LossAggregation,
    aggregate,
    aggregate_with,
    token_and_seq_counts,
)
from rlloom.core_rl.algorithms.entropy_control import (
    AdaptiveEntropyController,
    applied_entropy_coef,
    next_entropy_coef,
)
from rlloom.core_rl.algorithms.entropy_mask import high_entropy_token_mask
from rlloom.core_rl.algorithms.estimators import (
    ADVANTAGE_ESTIMATORS,
    GROUP_RELATIVE_ESTIMATORS,
    AdvantageEstimator,
    AdvantageInputs,
    get_advantage_estimator,
    register_advantage,
)
from rlloom.core_rl.algorithms.filtering import (
    filter_groups_by_mean,
    filter_zero_variance_groups,
    mask_truncated_responses,
    overlong_reward_penalty,
    truncated_responses,
)
from rlloom.core_rl.algorithms.groups import GroupIds, GroupStats, group_index, group_stats
from rlloom.core_rl.algorithms.kl import KL_KINDS, apply_kl_in_reward, kl_penalty
from rlloom.core_rl.algorithms.kl_control import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    make_kl_controller,
)
from rlloom.core_rl.algorithms.logits import entropy_from_logits, logprobs_from_logits
from rlloom.core_rl.algorithms.masked_stats import masked_mean, masked_sum, masked_var, masked_whiten
from rlloom.core_rl.algorithms.mismatch import TIS_MODES, mismatch_metrics, off_policy_weights, tis_weights
from rlloom.core_rl.algorithms.policy_loss import (
    POLICY_LOSSES,
    STANDARD_LOSS_ARGUMENTS,
    LossTraits,
    PolicyLossFn,
    cispo_policy_loss,
    clip_cov_policy_loss,
    get_policy_loss,
    gmpo_policy_loss,
    gpg_policy_loss,
    gspo_policy_loss,
    kl_cov_policy_loss,
    policy_loss_traits,
    ppo_policy_loss,
    register_policy_loss,
    sapo_gate,
    sapo_policy_loss,
)
from rlloom.core_rl.algorithms.registry import Registry, UnknownNameError
from rlloom.core_rl.algorithms.value_loss import value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "GROUP_RELATIVE_ESTIMATORS",
    "KL_KINDS",
    "POLICY_LOSSES",
    "STANDARD_LOSS_ARGUMENTS",
    "TIS_MODES",
    "AdaptiveEntropyController",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "AdvantageInputs",
    "AggMode",
    "FixedKLController",
    "GroupIds",
    "GroupStats",
    "KLController",
    "LossAggregation",
    "LossTraits",
    "PolicyLossFn",
    "Registry",
    "UnknownNameError",
    "aggregate",
    "aggregate_with",
    "applied_entropy_coef",
    "apply_kl_in_reward",
    "cispo_policy_loss",
    "clip_cov_policy_loss",
    "discounted_returns",
    "entropy_from_logits",
    "filter_groups_by_mean",
    "filter_zero_variance_groups",
    "gae_advantages",
    "get_advantage_estimator",
    "get_policy_loss",
    "gmpo_policy_loss",
    "gpg_advantages",
    "gpg_policy_loss",
    "group_index",
    "group_stats",
    "grpo_advantages",
    "grpo_passk_advantages",
    "gspo_policy_loss",
    "high_entropy_token_mask",
    "kl_cov_policy_loss",
    "kl_penalty",
    "logprobs_from_logits",
    "make_kl_controller",
    "mask_truncated_responses",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "mismatch_metrics",
    "next_entropy_coef",
    "off_policy_weights",
    "opo_advantages",
    "overlong_reward_penalty",
    "policy_loss_traits",
    "ppo_policy_loss",
    "register_advantage",
    "register_policy_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "remax_advantages",
    "rloo_advantages",
    "sapo_gate",
    "sapo_policy_loss",
    "tis_weights",
    "token_and_seq_counts",
    "truncated_responses",
    "value_loss",
]
