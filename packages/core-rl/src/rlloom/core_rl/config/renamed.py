"""The keys of `algorithm` that issue 38 moved into its advantage, policy-loss and KL sections: plain renames, read
by `migration` (a config written for the old names loads, with a hint) and by `keys` (a typo of an old name
suggests the new key). Data only, so both can import it.
"""

from __future__ import annotations

# flat key under `algorithm` → its place in the advantage, policy-loss and KL sections (issue 38); plain renames:
# these sections always exist, so no value switches anything
RENAMED_KEYS: dict[str, str] = {
    "adv_estimator": "advantage.estimator",
    "norm_adv_by_std": "advantage.norm_by_std",
    "adv_epsilon": "advantage.epsilon",
    "adv_std_scope": "advantage.std_scope",
    "gamma": "advantage.gamma",
    "lam": "advantage.lam",
    "policy_loss_kwargs": "policy_loss.kwargs",
    "clip_low": "policy_loss.clip_low",
    "clip_high": "policy_loss.clip_high",
    "dual_clip": "policy_loss.dual_clip",
    "loss_agg_mode": "policy_loss.agg_mode",
    "use_kl_loss": "kl.use_loss",
    "kl_loss_coef": "kl.loss_coef",
    "kl_loss_type": "kl.loss_type",
    "use_kl_in_reward": "kl.use_in_reward",
    "kl_in_reward_type": "kl.reward_type",
    "kl_controller": "kl.controller",
    "kl_coef": "kl.reward_coef",
    "target_kl": "kl.target",
    "kl_horizon": "kl.horizon",
}
LOSS_NAME = "policy_loss.name"  # `algorithm.policy_loss: gspo`, a name before it became a section

__all__ = ["LOSS_NAME", "RENAMED_KEYS"]
