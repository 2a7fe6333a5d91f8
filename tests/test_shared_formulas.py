"""Rules that two packages implement each, because neither may depend on the other, pinned to each other here.

DAPO's soft overlong punishment (Yu et al. 2025, eq. 13): rlloom-rewards' `overlong_penalty` (a scalar, for
trainers that shape rewards in the scorer) and rlloom-core-rl's `overlong_reward_penalty` (tensors, for the
trainer's `algorithm.overlong`) take the same names and must give the same values.
"""

from __future__ import annotations

import pytest
import torch

from rlloom.core_rl.algorithms import overlong_reward_penalty
from rlloom.rewards import overlong_penalty


@pytest.mark.parametrize(("max_length", "buffer_length", "factor"), [(100, 20, 1.0), (8, 8, 0.5), (4096, 1, 2.0)])
def test_dapo_overlong_punishment_is_the_same_rule_in_both_packages(
    max_length: int, buffer_length: int, factor: float
) -> None:
    lengths = list(range(0, max_length + 3))
    tensor = overlong_reward_penalty(
        torch.tensor(lengths), max_length=max_length, buffer_length=buffer_length, penalty_factor=factor
    ).tolist()
    scalar = [
        overlong_penalty(n, max_length=max_length, buffer_length=buffer_length, penalty_factor=factor) for n in lengths
    ]
    assert scalar == pytest.approx(tensor, abs=1e-6)
    # eq. 13 by hand at three points: the buffer's start, its middle, and past the limit
    start = max_length - buffer_length
    assert overlong_penalty(start, max_length=max_length, buffer_length=buffer_length, penalty_factor=factor) == 0.0
    assert overlong_penalty(
        max_length + 2, max_length=max_length, buffer_length=buffer_length, penalty_factor=factor
    ) == (-factor)
