"""Scorers take ground truth as parquet rows deliver it (numpy arrays and scalars) and report bad input in `.error`.

Rows read with `pandas.read_parquet(...).to_dict("records")` (veRL and Search-R1 data) hold numpy arrays where
the data had lists; those tests use real numpy arrays and are skipped where numpy is not installed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pytest

from rlloom.rewards.batch import score_batch
from rlloom.rewards.code import humaneval_scorer, io_scorer, mbpp_scorer
from rlloom.rewards.format import r1_format_scorer, search_r1_format_scorer, think_boxed_format_scorer
from rlloom.rewards.math import math_scorer
from rlloom.rewards.math.easyr1 import easyr1_math_scorer
from rlloom.rewards.qa import exact_match, qa_em_scorer, qa_golds
from rlloom.rewards.scorer_inputs import plain

HERE = os.path.abspath(__file__)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="strong isolation needs root (CI runs as root)")


def returns_nan(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    return float("nan")


class ArrayLike:
    """Stands in for any array type: only `tolist()`, not a list or a Sequence."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def tolist(self) -> list[Any]:
        return list(self.items)


def test_plain_unwraps_array_likes_and_tuples() -> None:
    assert plain(ArrayLike(["a", "b"])) == ["a", "b"]
    assert plain({"target": ArrayLike([ArrayLike(["x"]), ("y", "z")])}) == {"target": [["x"], ["y", "z"]]}
    assert plain(("a",)) == ["a"] and plain("abc") == "abc" and plain(None) is None
    assert qa_golds(("Paris", "paris, france")) == ["Paris", "paris, france"]
    assert exact_match("Paris", ArrayLike(["Lyon", "Paris"])) == 1.0  # type: ignore[arg-type]


def test_numpy_ground_truth_as_parquet_gives_it() -> None:
    np = pytest.importorskip("numpy")
    aliases = np.array(["Shakespeare", "William Shakespeare"], dtype=object)
    answer = "<answer>William Shakespeare</answer>"
    assert qa_em_scorer(answer, aliases).score == 1.0
    assert qa_em_scorer(answer, {"target": aliases}).score == 1.0  # Search-R1's reward_model.ground_truth
    assert qa_em_scorer(answer, {"target": np.array(["Marlowe"])}).score == 0.0  # still compared, not accepted
    assert qa_em_scorer("<answer>1990</answer>", np.int64(1990)).score == 1.0
    assert math_scorer("so \\boxed{4}", np.array(["4"], dtype=object)).score == 1.0
    assert math_scorer("so \\boxed{4}", np.array(["5", "6"])).score == 0.0
    for gold in (np.int64(4), np.array([4]), np.str_("4"), np.float64(4.0)):
        result = math_scorer("so \\boxed{4}", gold)
        assert (result.score, result.error) == (1.0, None), gold


def test_numpy_ground_truth_through_score_batch() -> None:
    np = pytest.importorskip("numpy")
    items = [
        ("<answer>Shakespeare</answer>", {"target": np.array(["Shakespeare"], dtype=object)}, "nq"),
        ("\\boxed{4}", np.array(["4"], dtype=object), "math"),
        ("\\boxed{4}", np.array(["5"], dtype=object), "math"),
    ]
    for workers in (0, 1):
        results = score_batch(items, workers=workers, timeout=30)
        assert [(r.score, r.error) for r in results] == [(1.0, None), (1.0, None), (0.0, None)], workers


def test_non_finite_score_is_an_error_in_score_batch() -> None:
    items = [("x", "y", f"{HERE}:returns_nan"), ("\\boxed{4}", "4", "gsm8k")]
    nan_result, ok = score_batch(items, workers=0)
    assert nan_result.score == 0.0
    assert nan_result.error is not None and "returns_nan" in nan_result.error and "nan" in nan_result.error
    assert (ok.score, ok.error) == (1.0, None)


@pytest.mark.parametrize(
    "scorer",
    [
        math_scorer,
        qa_em_scorer,
        r1_format_scorer,
        think_boxed_format_scorer,
        search_r1_format_scorer,
        easyr1_math_scorer,
    ],
)
def test_non_text_response_is_an_error_result(scorer: Any) -> None:
    result = scorer(None, ["Paris"])
    assert result.score == 0.0 and result.error is not None and "response must be a str" in result.error
    assert "NoneType" in result.error


def test_bad_qa_ground_truth_is_an_error_result() -> None:
    result = qa_em_scorer("<answer>Paris</answer>", None)
    assert result.score == 0.0 and result.error is not None
    assert "ground_truth must be a str, a list of str or {'target': [...]}" in result.error


@needs_root
def test_code_scorers_report_bad_input_instead_of_raising() -> None:
    answer = "```python\ndef add(a, b):\n    return a + b\n```"
    cases = [
        (mbpp_scorer(answer, None), "mbpp ground_truth needs a 'test_list' field (list)"),
        (mbpp_scorer(answer, ["assert add(1, 2) == 3"]), "needs a 'test_list' field"),
        (mbpp_scorer(answer, {"test_list": ["assert add(1, 2) = 3"]}), "not valid Python"),
        (mbpp_scorer(answer, {"test_list": []}), "asserts is empty"),
        (mbpp_scorer(None, {"test_list": ["assert add(1, 2) == 3"]}), "response must be a str"),
        (humaneval_scorer(answer, {"test": "def check(c):\n    assert c(1, 2) == 3\n"}), "'entry_point'"),
        (io_scorer(answer, {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n"]}), "2 inputs but 1 outputs"),
        (io_scorer(answer, {"inputs": "1", "outputs": ["1"]}), "ground_truth['inputs'] must be list"),
        (io_scorer(answer, {"inputs": [], "outputs": []}), "cases is empty"),
        (io_scorer(answer, "{inputs"), "not JSON"),
        (io_scorer(answer, {"inputs": ["1"], "outputs": [2], "fn_name": "add"}), "inputs[0] is a str"),
    ]
    for result, message in cases:
        assert result.score == 0.0 and message in (result.error or ""), (message, result.error)
