"""Scorer-protocol wrappers: code extraction from model answers and the ScoreResult they return."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from rlloom.rewards.code import extract_code, humaneval_scorer, io_scorer, mbpp_scorer
from rlloom.rewards.types import ScoreResult

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="strong isolation needs root (CI runs as root)"),
]
DATA = Path(__file__).parent / "data"
with gzip.open(DATA / "code_humaneval.jsonl.gz", "rt") as f:
    HE0 = json.loads(f.readline())  # HumanEval/0: has_close_elements


def test_extract_code_prefers_the_last_python_block() -> None:
    answer = "First try:\n```python\nx = 1\n```\nBetter:\n```py\nx = 2\n```\nShell:\n```bash\nls\n```\n"
    assert extract_code(answer) == "x = 2\n"
    assert extract_code("```\ny = 3\n```") == "y = 3\n"
    assert extract_code("z = 4") == "z = 4"


def test_humaneval_scorer_on_a_chat_answer() -> None:
    answer = f"Here you go:\n```python\n{HE0['prompt']}{HE0['canonical_solution']}```\nDone."
    result = humaneval_scorer(answer, {"test": HE0["test"], "entry_point": HE0["entry_point"]})
    assert isinstance(result, ScoreResult)
    assert result.score == 1.0 and result.error is None
    assert result.components == {"passed": 7.0, "total": 7.0}
    assert result.details["status"] == "passed"


def test_humaneval_scorer_on_a_completion_with_the_prompt() -> None:
    truth = {"test": HE0["test"], "entry_point": HE0["entry_point"]}
    result = humaneval_scorer(HE0["canonical_solution"], truth, extra_info={"prompt": HE0["prompt"]})
    assert result.score == 1.0
    # a full function (without the prompt's imports) still works when the prompt is given
    body = HE0["canonical_solution"]
    full = f"```python\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n{body}```"
    assert humaneval_scorer(full, truth, extra_info={"prompt": HE0["prompt"]}).score == 1.0


def test_humaneval_scorer_wrong_and_all_or_nothing() -> None:
    truth = {"test": HE0["test"], "entry_point": HE0["entry_point"]}
    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```"
    partial = humaneval_scorer(wrong, truth)
    assert 0.0 < partial.score < 1.0 and partial.error is None  # 4 of its 7 asserts expect True
    assert partial.score == pytest.approx(4 / 7)
    assert humaneval_scorer(wrong, truth, extra_info={"partial": False}).score == 0.0


def test_mbpp_scorer() -> None:
    truth = {"test_list": ["assert square(3) == 9", "assert square(-2) == 4"], "test_setup_code": ""}
    good = mbpp_scorer("```python\ndef square(x):\n    return x * x\n```", truth)
    assert good.score == 1.0
    looping = mbpp_scorer("def square(x):\n    while True:\n        pass", truth, extra_info={"timeout": 1.0})
    # the model's program failing is a score of 0, not a failure to score (a trainer counts `error` as its reward
    # pipeline breaking): how it ended is in the details
    assert looping.score == 0.0 and looping.error is None and looping.details["status"] == "timeout"
    broken = mbpp_scorer("def square(x) return x * x", truth)
    assert (broken.score, broken.error, broken.details["status"]) == (0.0, None, "error")
    assert "SyntaxError" in broken.details["reason"]


def test_io_scorer() -> None:
    truth = {"inputs": ["2 3\n", "10 -4\n"], "outputs": ["5\n", "6\n"]}
    answer = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert io_scorer(answer, truth).score == 1.0
    assert io_scorer("print(5)", truth).score == 0.5
    as_json = json.dumps({"inputs": ["1 1\n"], "outputs": [["2"]]})  # verl/PRIME store it as a JSON string
    assert io_scorer(answer, as_json).score == 1.0


def test_malformed_ground_truth_is_an_error_result_naming_the_field() -> None:
    cases = [
        (humaneval_scorer("x", {"test": HE0["test"]}), "'entry_point'"),
        (mbpp_scorer("x", {"tests": []}), "'test_list'"),
        (io_scorer("x", {"inputs": ["1", "2"], "outputs": ["1"]}), "2 inputs but 1 outputs"),
        (io_scorer("x", {"inputs": "1", "outputs": ["1"]}), "ground_truth['inputs'] must be list"),
        (io_scorer("x", {"inputs": [[1]], "outputs": [[1]], "fn_name": "no such"}), "must be a Python function name"),
        (io_scorer("x", "{inputs"), "not JSON"),
    ]
    for result, message in cases:
        assert result.score == 0.0 and message in (result.error or ""), (message, result.error)


def test_io_scorer_call_based_apps_task() -> None:
    """APPS/TACO call-based rows: inputs are argument lists, outputs return values (APPS wraps them in a list)."""
    truth = {"fn_name": "pair_sum", "inputs": [[1, 2], [[3, 4], 5], ["a", "b"]], "outputs": [[3], [[8, 9]], ["ab"]]}
    good = (
        "```python\ndef pair_sum(a, b):\n    if isinstance(a, list):\n        return (a[0] + b, a[1] + b)\n"
        "    return a + b\n```"
    )
    result = io_scorer(good, truth)
    assert (result.score, result.error, result.components) == (1.0, None, {"passed": 3.0, "total": 3.0})
    wrong = "def pair_sum(a, b):\n    return a * 2 if not isinstance(a, list) else [0, 0]"
    partial = io_scorer(wrong, truth)  # 1 * 2 != 3, [0, 0] != [8, 9], "a" * 2 != "ab"
    assert partial.score == 0.0 and partial.details["status"] == "failed"
    half = "def pair_sum(a, b):\n    return a + b if not isinstance(a, list) else None"
    assert io_scorer(half, truth).score == pytest.approx(2 / 3)
    as_json = json.dumps({"fn_name": "pair_sum", "inputs": [[2, 2]], "outputs": [4]})  # unwrapped output too
    assert io_scorer(good, as_json).score == 1.0
    leetcode = "class Solution:\n    def pair_sum(self, a, b):\n        return a + b"
    assert io_scorer(leetcode, {"fn_name": "pair_sum", "inputs": [[1, 2], [5, 5]], "outputs": [3, 10]}).score == 1.0
    missing = io_scorer("def other(a, b):\n    return a + b", truth)
    assert missing.score == 0.0 and "NameError" in missing.details["tests"][0]["reason"]


def test_io_scorer_call_based_refuses_always_equal_results() -> None:
    cheat = "class Eq:\n    def __eq__(self, other):\n        return True\n\ndef f(x):\n    return Eq()"
    result = io_scorer(cheat, {"fn_name": "f", "inputs": [[1]], "outputs": [[2]]})
    assert result.score == 0.0 and "own __eq__ would decide" in result.details["tests"][0]["reason"]


def test_extra_info_knobs_are_validated_not_coerced() -> None:
    # 1 of 2 asserts passes: partial credit is 0.5, all-or-nothing is 0.
    half = {"test_list": ["assert f() == 2", "assert f() == 1"]}
    answer = "def f():\n    return 1\n"
    for off in (False, "false", "False", 0, "0", "no"):
        assert mbpp_scorer(answer, half, extra_info={"partial": off}).score == 0.0, off
    for on in (True, "true", 1, None):
        assert mbpp_scorer(answer, half, extra_info={"partial": on}).score == 0.5, on
    assert mbpp_scorer(answer, half, extra_info={"timeout": None}).score == 0.5  # None means the default
    for key, value in [("timeout", "abc"), ("timeout", 0), ("memory_mb", "1e3"), ("partial", "maybe")]:
        for scorer, truth in [
            (mbpp_scorer, half),
            (humaneval_scorer, {"test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}),
            (io_scorer, {"inputs": ["1\n"], "outputs": ["1\n"]}),
        ]:
            result = scorer(answer, truth, extra_info={key: value})
            assert result.score == 0.0 and f"extra_info[{key!r}]" in (result.error or ""), (scorer, key, result)
