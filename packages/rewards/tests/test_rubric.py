"""Rubric: weighted sums, per-component reporting, broken terms isolated, async terms."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from rlloom.rewards.rubric import Rubric, RubricTerm
from rlloom.rewards.types import ScoreResult


def broken(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    raise KeyError("missing field")


async def async_half(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    await asyncio.sleep(0)
    return 0.5


R1_ANSWER = "<think>The capital of France is Paris.</think><answer>Paris</answer>"


def test_weighted_sum_and_components() -> None:
    rubric = Rubric([("accuracy", "qa_em", 0.9), ("format", "r1_format", 0.1), ("f1", "qa_f1", 0.0)])
    result = rubric(R1_ANSWER, ["paris"])
    assert result.score == pytest.approx(0.9 * 1 + 0.1 * 1)
    assert result.components["accuracy"] == 1.0 and result.components["format"] == 1.0
    assert result.components["accuracy/f1"] == 1.0  # sub-components of each term are kept, prefixed
    assert result.extracted == "Paris" and result.error is None
    unformatted = rubric("<answer>Paris</answer>", ["paris"])
    assert unformatted.score == pytest.approx(0.9) and unformatted.components["format"] == 0.0
    assert "found 0" in unformatted.details["format"]["reason"]


def test_broken_term_scores_zero_and_is_reported() -> None:
    rubric = Rubric(
        [RubricTerm(name="em", scorer="qa_em", weight=1.0), RubricTerm(name="bad", scorer=broken, weight=2.0)]
    )
    result = rubric("<answer>Paris</answer>", ["paris"])
    assert result.score == 1.0 and result.components == {
        "em": 1.0,
        "em/em": 1.0,
        "em/f1": 1.0,
        "em/sub_em": 1.0,
        "bad": 0.0,
    }
    assert result.error == "bad: KeyError: 'missing field'"


def test_async_terms_sync_and_async_paths() -> None:
    rubric = Rubric([("half", async_half, 2.0), ("em", "qa_em", 1.0)])
    assert rubric("<answer>x</answer>", "x").score == pytest.approx(2.0)
    result: ScoreResult = asyncio.run(rubric.ascore("<answer>y</answer>", "x"))
    assert result.score == pytest.approx(1.0) and result.components["half"] == 0.5


def test_rubric_validation() -> None:
    with pytest.raises(ValueError, match="at least one term"):
        Rubric([])
    with pytest.raises(ValueError, match="repeated: \\['a'\\]"):
        Rubric([("a", "qa_em", 1.0), ("a", "qa_f1", 1.0)])
    with pytest.raises(ValueError, match=r"term 0 is a tuple of 2 element\(s\).*\(name, scorer, weight\)"):
        Rubric([("n", "gsm8k")])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"term 1 is a str.*\(name, scorer, weight\)"):
        Rubric([("a", "qa_em", 1.0), "qa_f1"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="finite"):
        Rubric([("a", "qa_em", float("nan"))])


def nan_score(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    return float("nan")


def inf_result(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    return ScoreResult(score=float("-inf"), details={"why": "overflow"})


def test_non_finite_terms_score_zero_with_an_error() -> None:
    rubric = Rubric([("n", nan_score, 1.0), ("i", inf_result, 1.0), ("em", "qa_em", 0.5)])
    result = rubric("<answer>x</answer>", "x")
    assert result.score == 0.5 and result.components == {"n": 0.0, "i": 0.0, "em": 1.0, "em/em": 1.0, "em/f1": 1.0,
                                                         "em/sub_em": 1.0}  # fmt: skip
    assert result.error == (
        "n: scorer 'nan_score' returned a non-finite score (nan); scored 0; "
        "i: scorer 'inf_result' returned a non-finite score (-inf); scored 0"
    )
    assert result.details["i"] == {"why": "overflow"}
    async_result = asyncio.run(rubric.ascore("<answer>x</answer>", "x"))
    assert async_result.score == 0.5 and async_result.error == result.error
