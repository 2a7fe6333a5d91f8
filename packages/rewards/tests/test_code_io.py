"""stdin/stdout tasks: float tolerance (as APPS and veRL's prime_code compare), and a time budget for all cases
together, so a slow program fails its tests instead of running past the batch pool's item deadline."""

from __future__ import annotations

import os
import time

import pytest

from rlloom.rewards import batch
from rlloom.rewards.batch import score_batch
from rlloom.rewards.code import check_io, io_scorer
from rlloom.rewards.code.harness import same_output
from rlloom.rewards.code.scorers import IO_TIME_BUDGET

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="strong isolation needs root (CI runs as root)")


@pytest.mark.parametrize(
    ("actual", "expected", "tolerance", "same"),
    [
        ("0.3333333", "0.333333333", 1e-6, True),  # |diff| 3.3e-8
        ("0.3334", "0.333333333", 1e-6, False),
        ("1000000.5", "1000000.0", 1e-6, True),  # relative: 0.5 <= 1e-6 * 1e6
        ("1000002.0", "1000000.0", 1e-6, False),
        ("1000001", "1000000", 1e-6, False),  # integers compare exactly, whatever the tolerance
        ("2.0", "2", 1e-6, False),
        ("0.1 0.2", "0.1000000001 0.2", 1e-6, True),  # token by token
        ("0.1", "0.1 0.2", 1e-6, False),
        ("nan", "nan", 1e-6, True),  # equal tokens
        ("inf", "1e308", 1e-6, False),
        ("abc", "1.5", 1e-6, False),
        ("0.3333333", "0.333333333", None, False),  # no tolerance: tokens compare exactly
    ],
)
def test_same_output_with_float_tolerance(actual: str, expected: str, tolerance: float | None, same: bool) -> None:
    assert same_output(actual, expected, tolerance) is same


@needs_root
def test_io_scorer_float_tolerance_option() -> None:
    truth = {"inputs": ["1 3\n", "2 3\n"], "outputs": ["0.333333333\n", "0.666666667\n"]}
    code = "a, b = map(int, input().split())\nprint(f'{a / b:.7f}')\n"
    assert io_scorer(code, truth).score == 0.0  # exact tokens: 0.3333333 != 0.333333333
    assert io_scorer(code, truth, extra_info={"float_tolerance": 1e-6}).score == 1.0
    bad = io_scorer(code, truth, extra_info={"float_tolerance": "loose"})
    assert bad.score == 0.0 and "float_tolerance" in (bad.error or "")


def test_io_budget_stays_under_the_batch_pool_deadline() -> None:
    """The default budget plus the last case's clean-up must fit in score_batch's default item deadline."""
    assert IO_TIME_BUDGET + 5 <= batch.DEFAULT_TIMEOUT


@needs_root
def test_time_budget_bounds_all_cases_together() -> None:
    slow = "import time\ntime.sleep(30)\n"
    cases = [("", "x\n")] * 10
    start = time.monotonic()
    result = check_io(slow, cases, timeout=1.0, time_budget=2.5)
    assert time.monotonic() - start < 6  # ten 1 s cases would take 10 s
    assert (result.score, result.status) == (0.0, "timeout")
    assert [t.reason for t in result.tests][-1] == "timeout (the task's time budget was spent)"
    with pytest.raises(ValueError, match="time_budget"):
        check_io(slow, cases, time_budget=0)


@needs_root
def test_slow_program_is_failed_tests_not_a_scorer_timeout() -> None:
    """Per-case limits that add up past the pool's item deadline (12 x 1 s > 10 s) no longer kill the worker."""
    slow_truth = {"inputs": ["1\n"] * 12, "outputs": ["1\n"] * 12}
    slow = "import time\ntime.sleep(30)\n"
    honest_truth = {"inputs": ["1\n", "2\n"], "outputs": ["1\n", "2\n"]}
    honest = "print(input())\n"
    items = [(slow, slow_truth, "io", {"timeout": 1.0, "time_budget": 3.0}), (honest, honest_truth, "io", {})]
    results = score_batch(items, workers=1, timeout=10.0)
    assert results[0].error is None and results[0].score == 0.0, results[0]
    assert results[0].details["status"] == "timeout"
    assert results[1].error is None and results[1].score == 1.0, results[1]
