"""Config loading and checking never import torch (issue 41: a typo answers in about a second), and the names the
config knows without torch (`config.catalog`) are exactly those the algorithms register."""

from __future__ import annotations

import inspect
import subprocess
import sys

from rlloom.core_rl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    GROUP_RELATIVE_ESTIMATORS,
    KL_KINDS,
    POLICY_LOSSES,
    STANDARD_LOSS_ARGUMENTS,
    get_policy_loss,
    policy_loss_traits,
)
from rlloom.core_rl.config.catalog import BUILTIN_ESTIMATORS, BUILTIN_LOSSES, LossInfo
from rlloom.core_rl.config.catalog import KL_KINDS as CATALOG_KL_KINDS

_LOAD = """
import sys
from rlloom.core_rl.config import ConfigError, load_config
cfg = load_config(None, ["model.path=/m", "algorithm.advantage.estimator=rloo", "algorithm.kl.use_in_reward=true",
                         "algorithm.policy_loss.name=gmpo", "algorithm.policy_loss.agg_mode=seq-mean-token-mean",
                         "algorithm.kl.loss_type=k3+", "data.sampler.class_path=null"])
errors = []
for bad in (["algorithm.advantage.estimator=grpoo"], ["rollout.n=1"], ["algorithm.kl.reward_type=k7"],
            ["algorithm.policy_loss.name=gspo", "algorithm.policy_loss.dual_clip=3"], ["actor.learning_rate=1"]):
    try:
        load_config(None, ["model.path=/m", *bad])
    except ConfigError as err:
        errors.append(str(err).split(":")[0])
print(errors, "torch" in sys.modules)
"""


def test_loading_and_checking_a_config_imports_no_torch() -> None:
    done = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True, text=True, timeout=120, check=True)
    errors = [
        "algorithm.advantage.estimator",
        "rollout.n",
        "algorithm.kl.reward_type",
        "algorithm.policy_loss.dual_clip",
        "command-line override 'actor.learning_rate=1'",
    ]
    assert done.stdout.strip() == f"{errors} False"


def test_the_catalog_lists_what_the_algorithms_register() -> None:
    assert sorted(BUILTIN_ESTIMATORS) == ADVANTAGE_ESTIMATORS.names()
    assert {name for name, group in BUILTIN_ESTIMATORS.items() if group} == GROUP_RELATIVE_ESTIMATORS
    assert sorted(BUILTIN_LOSSES) == POLICY_LOSSES.names()
    for name, info in BUILTIN_LOSSES.items():
        traits = policy_loss_traits(name)
        own = tuple(p for p in inspect.signature(get_policy_loss(name)).parameters if p not in STANDARD_LOSS_ARGUMENTS)
        assert info == LossInfo(traits.dual_clip, traits.sequence_level, own), name
    assert KL_KINDS is CATALOG_KL_KINDS
