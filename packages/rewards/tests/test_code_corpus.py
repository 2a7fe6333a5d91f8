"""Real corpora through the pool: HumanEval's and MBPP's reference solutions pass; wrong and cheating ones fail."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

from rlloom.rewards.code import CodeTask, Limits, check_many

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="strong isolation needs root (CI runs as root)"),
]
DATA = Path(__file__).parent / "data"
LIMITS = Limits(timeout=20.0)  # generous: the machine is shared and CI has 2 cores


def _rows(name: str) -> list[dict[str, Any]]:
    with gzip.open(DATA / name, "rt") as f:
        return [json.loads(line) for line in f]


HUMANEVAL = _rows("code_humaneval.jsonl.gz")
MBPP = _rows("code_mbpp_test.jsonl.gz")

# Wraps the entry point so every result is changed in a type-preserving way: the tests must notice.
WRONG = """
def _rlloom_wrong(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, (list, tuple)):
        return value[:-1] if value else type(value)([0])
    return 0 if value is None else None

_rlloom_right = {entry}

def {entry}(*args, **kwargs):
    return _rlloom_wrong(_rlloom_right(*args, **kwargs))
"""

# The generic reward hack: an object that equals everything, is truthy, and absorbs arithmetic.
ALWAYS_EQUAL = """
class _Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __lt__(self, other):
        return True
    __le__ = __gt__ = __ge__ = __lt__
    def __bool__(self):
        return True
    def __sub__(self, other):
        return 0.0
    __rsub__ = __add__ = __radd__ = __sub__
    def __abs__(self):
        return 0.0
    def __len__(self):
        return 0
    def __iter__(self):
        return iter(())
    __hash__ = object.__hash__

def {entry}(*args, **kwargs):
    return _Anything()
"""


def _humaneval(code_for: Any) -> list[CodeTask]:
    """HumanEval tasks with their prompts as trusted helpers: HumanEval/32, 38 and 50 test with `poly`,
    `encode_cyclic` and `encode_shift`, which only the prompt defines (the checker refuses them without it)."""
    return [
        CodeTask(
            kind="function", code=code_for(r), test=r["test"], entry_point=r["entry_point"], helpers=r["prompt"],
            limits=LIMITS,
        )
        for r in HUMANEVAL
    ]  # fmt: skip


def test_corpora_are_complete() -> None:
    assert len(HUMANEVAL) == 164 and len(MBPP) == 500
    assert sorted(r["task_id"] for r in MBPP) == list(range(11, 511))


def test_humaneval_canonical_solutions_all_pass() -> None:
    results = check_many(_humaneval(lambda r: r["prompt"] + r["canonical_solution"]), max_workers=2)
    failures = {r["task_id"]: res.tests for r, res in zip(HUMANEVAL, results, strict=True) if res.status != "passed"}
    assert failures == {}
    assert all(res.score == 1.0 and res.passed == res.total > 0 for res in results)


def test_humaneval_wrong_variants_all_fail() -> None:
    code = lambda r: r["prompt"] + r["canonical_solution"] + WRONG.format(entry=r["entry_point"])  # noqa: E731
    results = check_many(_humaneval(code), max_workers=2)
    passing = [r["task_id"] for r, res in zip(HUMANEVAL, results, strict=True) if res.status == "passed"]
    assert passing == []
    assert all(res.status == "failed" for res in results)


def test_humaneval_always_equal_hack_earns_nothing() -> None:
    """Nothing beyond what a constant empty answer earns: HumanEval/33 has a statement comparing the candidate
    with itself (`tuple(candidate(l)) == tuple(sort_third(l))`), which the object passes by iterating as empty,
    its items being data; `return []` passes it too. Its own `__eq__` decides nothing anywhere."""
    code = lambda r: r["prompt"] + ALWAYS_EQUAL.format(entry=r["entry_point"])  # noqa: E731
    results = check_many(_humaneval(code), max_workers=2)
    credited = {r["task_id"]: res.passed for r, res in zip(HUMANEVAL, results, strict=True) if res.passed > 0}
    assert set(credited) <= {"HumanEval/33"}
    empty = lambda r: r["prompt"] + f"\ndef {r['entry_point']}(*args, **kwargs):\n    return []\n"  # noqa: E731
    tasks = [t for t, r in zip(_humaneval(empty), HUMANEVAL, strict=True) if r["task_id"] in credited]
    baseline = dict(zip(credited, (res.passed for res in check_many(tasks, max_workers=2)), strict=True))
    assert all(credited[task] <= baseline[task] for task in credited), (credited, baseline)


def test_mbpp_reference_solutions_all_pass() -> None:
    tasks = [
        CodeTask(kind="asserts", code=r["code"], asserts=r["test_list"], setup=r["test_setup_code"], limits=LIMITS)
        for r in MBPP
    ]
    results = check_many(tasks, max_workers=2)
    failures = {r["task_id"]: res.tests for r, res in zip(MBPP, results, strict=True) if res.status != "passed"}
    assert failures == {}
