"""EasyR1's `math` reward (examples/reward_function/math.py), used for Geometry3K: 0.9 accuracy + 0.1 format.

Accuracy grades the last `\\boxed{}` against the ground truth with this package's math checker (EasyR1 uses
mathruler's `grade_answer`); a list ground truth such as Geometry3K's `[value, letter]` accepts either form.
Format is `think_boxed_format`: `<think>...</think>` then a boxed answer. Both see the response after EasyR1's
`strip_tag_spaces`. The two parts are reported as the `accuracy` and `format` components.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlloom.rewards.format import strip_tag_spaces, think_boxed_format_scorer
from rlloom.rewards.math.scorer import boxed_math_scorer
from rlloom.rewards.rubric import Rubric
from rlloom.rewards.scorer_inputs import not_text_error, response_text
from rlloom.rewards.types import ScoreResult

FORMAT_WEIGHT = 0.1  # EasyR1's `format_weight` default


boxed_accuracy_scorer = boxed_math_scorer
"""1.0 if the last `\\boxed{}` equals the ground truth (any form of a list); unboxed answers score 0."""


def easyr1_math_rubric(format_weight: float = FORMAT_WEIGHT) -> Rubric:
    """(1 - format_weight) * accuracy + format_weight * format, as EasyR1's `compute_score`."""
    return Rubric(
        [("accuracy", boxed_accuracy_scorer, 1.0 - format_weight), ("format", think_boxed_format_scorer, format_weight)]
    )


_RUBRIC = easyr1_math_rubric()


def easyr1_math_scorer(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    """`Scorer` for EasyR1's math reward (registry: `easyr1_math`, `geo3k_easyr1`)."""
    text = response_text(response)
    if text is None:
        return ScoreResult(score=0.0, error=not_text_error(response))
    return _RUBRIC(strip_tag_spaces(text), ground_truth, extra_info=extra_info)
