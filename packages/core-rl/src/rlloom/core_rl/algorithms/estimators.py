"""Advantage estimators selectable by name, all with one calling convention.

`get_advantage_estimator("grpo")(AdvantageInputs(...))` → `(advantages[B, T], returns[B, T])`, 0 on masked
tokens. Outcome estimators score each response as Σₜ token_rewards (so KL-in-reward penalties count) and broadcast
the advantage over its tokens; for them returns = advantages, as in veRL. A new estimator is one function:

    @register_advantage("my_estimator")
    def my_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]: ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from rlloom.core_rl.algorithms.advantages import (
    check_rewards_on_valid_tokens,
    discounted_returns,
    gae_advantages,
    gpg_advantages,
    grpo_advantages,
    grpo_passk_advantages,
    opo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from rlloom.core_rl.algorithms.groups import GroupIds
from rlloom.core_rl.algorithms.masked_stats import check_same_shape, masked_whiten
from rlloom.core_rl.algorithms.registry import Registry


@dataclass(frozen=True, eq=False)
class AdvantageInputs:
    """Everything any estimator may read; each uses what it needs and names what is missing.

    token_rewards / mask: [B, T] over the response; mask = 1 on model-generated tokens.
    group_ids: one id per response, equal for responses to the same prompt (GRPO, RLOO, GPG, REINFORCE++-baseline).
    values: critic values [B, T] (GAE). baseline_scores: greedy-response scores [B] (ReMax).
    """

    token_rewards: Tensor
    mask: Tensor
    group_ids: GroupIds | None = None
    values: Tensor | None = None
    baseline_scores: Tensor | None = None
    gamma: float = 1.0
    lam: float = 1.0
    norm_by_std: bool = True
    std_scope: str = "group"  # grpo: divide by the group's std or the whole batch's
    eps: float = 1e-6

    def __post_init__(self) -> None:
        check_same_shape(token_rewards=self.token_rewards, mask=self.mask)
        if self.token_rewards.dim() != 2:
            raise ValueError(f"token_rewards must be [B, T], got shape {tuple(self.token_rewards.shape)}")

    def scores(self) -> Tensor:
        """One score per response: the sum of its token rewards (refusing rewards on masked tokens)."""
        check_rewards_on_valid_tokens(self.token_rewards, self.mask)
        return self.token_rewards.detach().sum(-1)

    def require_group_ids(self, estimator: str) -> GroupIds:
        if self.group_ids is None:
            raise ValueError(f"advantage estimator {estimator!r} needs group_ids (the prompt uid of each response)")
        return self.group_ids


AdvantageEstimator = Callable[[AdvantageInputs], tuple[Tensor, Tensor]]
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")
_EstT = TypeVar("_EstT", bound=AdvantageEstimator)


GROUP_RELATIVE_ESTIMATORS: set[str] = set()
"""Estimators whose baseline is the prompt's own group: with one sample per prompt every advantage is 0, so the
config refuses them with `rollout.n=1` (TRL likewise refuses `num_generations < 2`)."""


def register_advantage(name: str, *, group_relative: bool = False) -> Callable[[_EstT], _EstT]:
    """Decorator: make an estimator selectable as `adv_estimator=<name>` (the function is returned unchanged).

    `group_relative`: the advantage compares a sample with the other samples of its prompt (needs `rollout.n` ≥ 2).
    """

    def decorator(fn: _EstT) -> _EstT:
        ADVANTAGE_ESTIMATORS.register(name)(fn)
        if group_relative:
            GROUP_RELATIVE_ESTIMATORS.add(name)
        return fn

    return decorator


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as `name` (raises with the valid names and the nearest match)."""
    return ADVANTAGE_ESTIMATORS.get(name)


def _broadcast(per_response: Tensor, mask: Tensor) -> Tensor:
    tokens = per_response.unsqueeze(-1).expand(mask.shape).to(torch.promote_types(per_response.dtype, torch.float32))
    return torch.where(mask.bool(), tokens, torch.zeros_like(tokens))


@register_advantage("gae")
def gae_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GAE with a critic (`gae_advantages`), advantages whitened over the batch's valid tokens; returns = A + V
    before whitening (the critic's targets).

    The whitening is what veRL's `compute_gae_advantage_return`, TRL's PPO and OpenRLHF do: with an outcome reward
    and a fresh critic (V ≈ 0) the raw advantages are the scores themselves, so a wrong answer (score 0) would get
    no push down until the critic learns. A batch with a single valid token is left as it is (no variance).
    """
    if inputs.values is None:
        raise ValueError("advantage estimator 'gae' needs values from a critic; enable the critic or pick 'grpo'")
    adv, returns = gae_advantages(inputs.token_rewards, inputs.values, inputs.mask, gamma=inputs.gamma, lam=inputs.lam)
    if int(inputs.mask.bool().sum()) >= 2:
        adv = masked_whiten(adv, inputs.mask)
    return adv, returns


@register_advantage("grpo_vectorized", group_relative=True)  # veRL's name of the same computation
@register_advantage("grpo", group_relative=True)
def grpo_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GRPO (`grpo_advantages`); `norm_by_std=False` gives Dr.GRPO."""
    adv = grpo_advantages(
        inputs.scores(),
        inputs.require_group_ids("grpo"),
        norm_by_std=inputs.norm_by_std,
        eps=inputs.eps,
        std_scope=inputs.std_scope,
    )
    tokens = _broadcast(adv, inputs.mask)
    return tokens, tokens


@register_advantage("dr_grpo", group_relative=True)
def dr_grpo_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Dr.GRPO: GRPO without the std division, whatever `norm_by_std` says (Liu et al. 2025)."""
    adv = grpo_advantages(inputs.scores(), inputs.require_group_ids("dr_grpo"), norm_by_std=False)
    tokens = _broadcast(adv, inputs.mask)
    return tokens, tokens


@register_advantage("grpo_passk", group_relative=True)
def grpo_passk_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Pass@k GRPO (`grpo_passk_advantages`): only the best response of each group is reinforced."""
    adv = grpo_passk_advantages(
        inputs.scores(), inputs.require_group_ids("grpo_passk"), norm_by_std=inputs.norm_by_std, eps=inputs.eps
    )
    tokens = _broadcast(adv, inputs.mask)
    return tokens, tokens


@register_advantage("rloo_vectorized", group_relative=True)  # veRL's name of the same computation
@register_advantage("rloo", group_relative=True)
def rloo_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """RLOO leave-one-out baseline (`rloo_advantages`)."""
    tokens = _broadcast(rloo_advantages(inputs.scores(), inputs.require_group_ids("rloo")), inputs.mask)
    return tokens, tokens


@register_advantage("gpg", group_relative=True)
def gpg_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GPG group-mean baseline with veRL's batch correction α (`gpg_advantages`)."""
    tokens = _broadcast(gpg_advantages(inputs.scores(), inputs.require_group_ids("gpg")), inputs.mask)
    return tokens, tokens


@register_advantage("opo", group_relative=True)
def opo_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """OPO length-weighted group baseline (`opo_advantages`), lengths = valid tokens per response."""
    lengths = inputs.mask.bool().sum(-1)
    tokens = _broadcast(opo_advantages(inputs.scores(), inputs.require_group_ids("opo"), lengths), inputs.mask)
    return tokens, tokens


@register_advantage("remax")
def remax_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """ReMax: reward-to-go Gₜ (γ = 1) minus the greedy response's score, as veRL's `remax`.

    With an outcome-only reward Gₜ is the response's score at every token, i.e. `remax_advantages` broadcast.
    """
    if inputs.baseline_scores is None:
        raise ValueError("advantage estimator 'remax' needs baseline_scores (the reward of a greedy response)")
    baseline = inputs.baseline_scores.detach()
    if baseline.shape != (inputs.mask.shape[0],):
        raise ValueError(f"baseline_scores must be [B] = [{inputs.mask.shape[0]}], got {tuple(baseline.shape)}")
    returns = discounted_returns(inputs.token_rewards, inputs.mask, gamma=1.0)
    adv = torch.where(inputs.mask.bool(), returns - baseline.unsqueeze(-1).to(returns.dtype), torch.zeros_like(returns))
    return adv, returns


@register_advantage("reinforce_plus_plus")
def reinforce_pp_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (`reinforce_pp_advantages`) with discount `gamma`."""
    return reinforce_pp_advantages(inputs.token_rewards, inputs.mask, gamma=inputs.gamma)


@register_advantage("reinforce_plus_plus_baseline", group_relative=True)
def reinforce_pp_baseline_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (`reinforce_pp_baseline_advantages`)."""
    adv = reinforce_pp_baseline_advantages(
        inputs.scores(), inputs.require_group_ids("reinforce_plus_plus_baseline"), inputs.mask
    )
    return adv, adv
