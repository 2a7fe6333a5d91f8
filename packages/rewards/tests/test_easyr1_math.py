"""EasyR1's `math` reward (Geometry3K): 0.9 boxed accuracy + 0.1 think/boxed format, by hand-worked cases."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlloom.rewards.format import strip_tag_spaces, think_boxed_format
from rlloom.rewards.math.easyr1 import easyr1_math_rubric, easyr1_math_scorer
from rlloom.rewards.registry import get_scorer
from rlloom.rewards.trainer_reward import RegistryReward

GOLD = ["80", "D"]  # Geometry3K problem 11: option D, value 80


@pytest.mark.parametrize(
    ("response", "accuracy", "fmt"),
    [
        ("<think>AB = 30, so x = 80.</think> The answer is \\boxed{80}.", 1.0, 1.0),
        ("<think>option D</think>\\boxed{D}", 1.0, 1.0),  # the letter counts as the value does
        ("<think>...</think>\\boxed{80.0}", 1.0, 1.0),  # the math checker, not string equality
        ("\\boxed{80}", 1.0, 0.0),  # right but no think block
        ("<think>x = 80</think> so x = 80", 0.0, 0.0),  # an unboxed answer is not read
        ("<think>hmm</think>\\boxed{60}", 0.0, 1.0),
        ("< think >hmm</ think >\\boxed{ 80 }", 1.0, 1.0),  # EasyR1 strips spaces around tag characters
        ("intro <think>a</think>\\boxed{80}", 1.0, 0.0),  # text before <think>: not a full match
        ("<think>a</think>\\boxed{60} then \\boxed{80}", 1.0, 1.0),  # the last box is the answer
    ],
)
def test_hand_worked_cases(response: str, accuracy: float, fmt: float) -> None:
    result = easyr1_math_scorer(response, GOLD)
    assert result.components == {"accuracy": accuracy, "format": fmt}
    assert result.score == pytest.approx(0.9 * accuracy + 0.1 * fmt)
    assert result.error is None


def test_format_reasons_and_weight() -> None:
    assert think_boxed_format("<think>a</think>no box") == (0.0, "no \\boxed{} answer after </think>")
    assert think_boxed_format("\\boxed{1}").reason == "no <think>...</think> block"
    assert strip_tag_spaces("< think > a </ think >") == "<think>a</think>"
    half = easyr1_math_rubric(format_weight=0.5)("\\boxed{80}", GOLD)
    assert half.score == pytest.approx(0.5)


def test_registered_and_torch_free() -> None:
    assert get_scorer("geo3k_easyr1") is easyr1_math_scorer
    assert get_scorer("easyr1_math") is easyr1_math_scorer
    code = "import sys, rlloom.rewards.math.easyr1; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


class _Traj:
    def __init__(self, response: str, source: str) -> None:
        self.response_text, self.data_source = response, source
        self.ground_truth, self.extra_info = GOLD, {}


def test_registry_reward_maps_a_data_source_to_another_scorer() -> None:
    trajectories = [_Traj("\\boxed{80}", "geometry3k")]
    with RegistryReward(workers=1, scorers={"geometry3k": "geo3k_easyr1"}) as easyr1:
        assert easyr1(trajectories)[0].components == {"accuracy": 1.0, "format": 0.0}
    with RegistryReward(workers=1) as plain:  # the registry's geometry3k scorer: accuracy only
        assert plain(trajectories)[0].score == 1.0
