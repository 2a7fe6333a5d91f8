"""The phases of one training step, each in its own module, called in order by `rlloom.core_rl.trainer`.

prompt_source (which prompts: loader, online filtering, curriculum feedback) → rollout_round (generate and score
one round, reward shaping on the way) → dynamic_sampling (more rounds until enough groups carry signal) or
off_policy (the round generated during the previous update) → token_weights (TIS and high-entropy selection from
the old-log-prob pass) → advantages (token rewards, KL in reward, the estimator) → controllers (entropy bonus).
Each module is pure or owns only its own state; the trainer owns the order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute

if TYPE_CHECKING:
    from rlloom.core_rl.phases.collection import score as score
    from rlloom.core_rl.phases.collection import single_turn_collector as single_turn_collector

_EXPORTS = {
    "score": "collection",
    "single_turn_collector": "collection",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
