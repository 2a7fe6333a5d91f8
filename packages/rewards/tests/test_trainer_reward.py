"""RegistryReward scores trajectory-like objects by data_source, in worker processes, without raising."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from rlloom.rewards.trainer_reward import RegistryReward


@dataclass
class Traj:  # the fields of core-rl's Trajectory that a reward reads
    response_text: str
    ground_truth: Any
    data_source: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)


def test_scores_by_data_source_and_reports_failures() -> None:
    add = {"test": "def check(candidate):\n    assert candidate(2, 3) == 5\n", "entry_point": "add"}
    trajs = [
        Traj("so \\boxed{12}", "12", "gsm8k"),
        Traj("\\boxed{13}", "12", "gsm8k"),
        Traj("```python\ndef add(a, b):\n    return a + b\n```", add, "humaneval"),
        Traj("```python\nimport time\ndef add(a, b):\n    time.sleep(60)\n```", add, "humaneval", {"timeout": 1}),
        Traj("<answer>Paris</answer>", {"target": ["Paris"]}, "nq"),
    ]
    with RegistryReward(workers=2, timeout=20) as reward:
        results = reward(trajs)
    assert [r.score for r in results] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert results[3].error is None and results[3].details["status"] == "timeout"  # the model's failure, scored 0
    assert results[0].error is None


def test_default_scorer_and_missing_source() -> None:
    with RegistryReward(workers=1, scorer="rlloom.rewards.math:math_scorer") as reward:
        assert [r.score for r in reward([Traj("\\boxed{1/2}", "0.5")])] == [1.0]
    with RegistryReward(workers=1) as reward, pytest.raises(ValueError, match="no data_source"):
        reward([Traj("x", "1")])
