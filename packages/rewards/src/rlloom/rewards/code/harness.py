"""Check a solution against tests in the sandbox and report only what the harness observed.

`check_asserts` (MBPP), `check_function` (HumanEval), `check_calls` (call-based APPS/TACO) and `check_io`
(stdin/stdout) return a `CodeResult`. For the first three, the tests run in the sandbox's
supervisor process, which never runs the solution: they reach it only through its names, and every value they get
back is data rebuilt from trusted types (see `wire.py`). A test counts as passed only when the supervisor wrote a
pass record for it after the statement ran, and the run ended with its completion record; a run without one
(early exit, `os._exit`, a kill, a timeout) scores zero, and any forged line on the result channel marks the run
`tampered`. For `check_io` the parent compares each case's output itself."""

from __future__ import annotations

import ast
import math
import re
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from rlloom.rewards.code.containment import SandboxError, mentions_scientific
from rlloom.rewards.code.probe import require
from rlloom.rewards.code.runner import Limits, Run, run_program
from rlloom.rewards.code.testplan import (
    Unit,
    assert_units,
    defined_names,
    function_units,
    helper_units,
    solution_names,
)

CodeStatus = Literal[
    "passed", "failed", "error", "timeout", "memory", "output_limit", "killed", "incomplete", "tampered"
]
_RUN_STATUS: dict[str, CodeStatus] = {
    "timeout": "timeout", "memory": "memory", "output_limit": "output_limit", "killed": "killed", "error": "error"
}  # fmt: skip


class TestOutcome(BaseModel):
    """One test's verdict as observed by the harness."""

    index: int = Field(description="Position among the tests (0-based).")
    passed: bool = Field(description="True only when the harness saw the test statement complete.")
    reason: str = Field(default="", description="Why it failed: exception type and message, or what was missing.")


class CodeResult(BaseModel):
    """The verdict on one solution: counts, overall status, score and per-test details."""

    passed: int = Field(description="Tests the harness observed passing.")
    total: int = Field(description="Tests in the task.")
    status: CodeStatus = Field(description="passed when all passed; failed; else how the run ended.")
    score: float = Field(description="passed/total, or 1.0/0.0 when all-or-nothing scoring was asked for.")
    tests: list[TestOutcome] = Field(default_factory=list, description="Per-test outcomes, in order.")
    stdout: str = Field(default="", description="What the program printed (first 2,000 characters).")
    stderr: str = Field(default="", description="Its standard error (last 2,000 characters).")
    duration: float = Field(default=0.0, description="Wall-clock seconds spent running it.")


class MissingHelpersError(ValueError):
    """The tests read names that only the task's own code (HumanEval's prompt) defines, and it was not given."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        super().__init__(
            f"the test reads {', '.join(names)}, which the task's prompt defines, not the solution: pass the "
            "prompt as helpers= (humaneval_scorer: extra_info['prompt'] or ground_truth['prompt']); the solution's "
            "own definitions are never used for them, or it could grade itself"
        )


def _score(passed: int, total: int, partial: bool) -> float:
    if partial:
        return passed / total if total else 0.0
    return 1.0 if total and passed == total else 0.0


def _judge(run: Run, units: list[Unit], partial: bool) -> CodeResult:
    """Count only well-formed records for real test indexes, once each, closed by a matching END record."""
    if run.status == "sandbox_error":
        raise SandboxError(f"the sandbox failed to start the program: {run.stderr[-1000:]}")
    test_indexes = [i for i, (kind, _) in enumerate(units) if kind == "test"]
    outcomes: dict[int, TestOutcome] = {}
    forged, ended = run.forged, False
    for key, value, reason in run.records:
        if ended:
            forged = True  # nothing may follow the completion record
        elif key == "END":
            ended = value == str(len(units))
            forged = forged or not ended
        elif key.isdigit() and int(key) in test_indexes and int(key) not in outcomes and value in ("P", "F"):
            outcomes[int(key)] = TestOutcome(index=test_indexes.index(int(key)), passed=value == "P", reason=reason)
        else:
            forged = True
    total = len(test_indexes)
    status: CodeStatus
    if forged or not ended or run.status != "ok":
        if forged:
            status, why = "tampered", "the result channel carried forged records"
        else:
            status = _RUN_STATUS.get(run.status, "incomplete") if run.status != "error" else "incomplete"
            why = f"the run ended without the harness's completion record ({status})"
        tests = [TestOutcome(index=i, passed=False, reason=why) for i in range(total)]
        passed = 0
    else:
        tests = [
            outcomes.get(unit, TestOutcome(index=i, passed=False, reason="not observed to pass"))
            for i, unit in enumerate(test_indexes)
        ]
        passed = sum(t.passed for t in tests)
        load_failed = passed == 0 and all(t.reason.startswith("solution") for t in tests)
        status = "passed" if passed == total else ("error" if load_failed else "failed")
    score = _score(passed, total, partial)
    return CodeResult(
        passed=passed, total=total, status=status, score=score, tests=tests, stdout=run.stdout[:2000],
        stderr=run.stderr[-2000:], duration=run.duration,
    )  # fmt: skip


def _run_units(
    job: dict[str, Any], units: list[Unit], limits: Limits, partial: bool, allow_weak_isolation: bool
) -> CodeResult:
    iso = require(allow_weak_isolation)
    run = run_program(job, mode=iso.mode, python=iso.python, limits=limits, tests=units)
    return _judge(run, units, partial)


def check_asserts(
    code: str,
    asserts: list[str],
    *,
    setup: str = "",
    timeout: float = 10.0,
    memory_mb: int = 512,
    partial: bool = True,
    limits: Limits | None = None,
    allow_weak_isolation: bool = False,
) -> CodeResult:
    """MBPP style: load `code`, run `setup`, then each assert statement; `timeout` covers the whole run."""
    units = assert_units(asserts, setup)
    chosen = limits or Limits(timeout=timeout, memory_mb=memory_mb)
    names, shadowed, imports = solution_names(setup, *asserts)
    job = {
        "kind": "asserts", "code": code, "required": [], "names": names, "shadowed": shadowed, "bind": [],
        "imports": imports, "scientific": mentions_scientific(setup, *asserts),
    }  # fmt: skip
    return _run_units(job, units, chosen, partial, allow_weak_isolation)


def check_function(
    code: str,
    test: str,
    entry_point: str,
    *,
    timeout: float = 10.0,
    memory_mb: int = 512,
    partial: bool = True,
    limits: Limits | None = None,
    allow_weak_isolation: bool = False,
    helpers: str = "",
) -> CodeResult:
    """HumanEval style: load `code`, bind `entry_point` to check's argument, run check's assertions one by one.

    `helpers` is trusted code shipped with the task (HumanEval's prompt), run on the test side first, so helpers
    the tests use (`poly`, `encode_cyclic`) are the task's own and not the solution's redefinitions. The solution
    provides the entry point only: a test that reads any other name neither it, the helpers nor the standard library
    defines raises `MissingHelpersError` (a ValueError) naming it, instead of taking the solution's.
    """
    units, param = function_units(test, entry_point)
    chosen = limits or Limits(timeout=timeout, memory_mb=memory_mb)
    names, _, imports = solution_names(test)
    provided = defined_names(helpers)
    missing = [name for name in names if name not in (entry_point, param) and name not in provided]
    if missing:
        raise MissingHelpersError(missing)
    job = {
        "kind": "function",
        "code": code,
        "required": [entry_point],
        "names": [name for name in names if name == entry_point],
        "shadowed": [],
        "bind": [[param, entry_point], [entry_point, entry_point]],
        "imports": imports,
        "scientific": mentions_scientific(test, helpers),
    }
    return _run_units(job, helper_units(helpers) + units, chosen, partial, allow_weak_isolation)


_CALL_SETUP = """
def __rlloom_lists__(value):
    if isinstance(value, (list, tuple)):
        return [__rlloom_lists__(v) for v in value]
    if isinstance(value, dict):
        return {k: __rlloom_lists__(v) for k, v in value.items()}
    return value

def __rlloom_same__(output, expected):
    output = __rlloom_lists__(output)
    return output == expected or (isinstance(expected, list) and len(expected) > 0 and output == expected[0])
"""
"""APPS/prime_code's call-based comparison: JSON has no tuples, so tuples returned compare as lists, and an
expected value stored wrapped in a one-element list (as APPS stores them) also matches unwrapped."""


def _literal(value: Any, what: str) -> str:
    text = repr(value)
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(f"{what} cannot be written as a Python literal ({type(exc).__name__}): {text[:100]}") from exc
    return text


def check_calls(
    code: str,
    fn_name: str,
    calls: list[tuple[list[Any], Any]],
    *,
    timeout: float = 10.0,
    memory_mb: int = 512,
    partial: bool = True,
    limits: Limits | None = None,
    allow_weak_isolation: bool = False,
) -> CodeResult:
    """Call-based APPS/TACO style: for each (arguments, expected), `fn_name(*arguments)` must return `expected`.

    Runs as `check_asserts` (one run, `timeout` covers it, results come back as data). When `code` defines
    `class Solution` (LeetCode style), `Solution().fn_name(...)` is called instead, as veRL's prime_code does.
    """
    if not fn_name.isidentifier():
        raise ValueError(f"fn_name {fn_name!r} is not a Python identifier")
    if not calls:
        raise ValueError("calls is empty: give at least one (arguments, expected) pair")
    target = f"Solution().{fn_name}" if re.search(r"^class\s+Solution\b", code, re.MULTILINE) else fn_name
    asserts = []
    for i, (args, expected) in enumerate(calls):
        if not isinstance(args, list | tuple):
            raise ValueError(f"calls[{i}] arguments must be a list, got {type(args).__name__}")
        arguments = _literal(list(args), f"calls[{i}] arguments")
        asserts.append(f"assert __rlloom_same__({target}(*{arguments}), {_literal(expected, f'calls[{i}] expected')})")
    return check_asserts(
        code, asserts, setup=_CALL_SETUP, timeout=timeout, memory_mb=memory_mb, partial=partial, limits=limits,
        allow_weak_isolation=allow_weak_isolation,
    )  # fmt: skip


def _close(actual: str, expected: str, tolerance: float) -> bool:
    """Tokens equal, or `expected` is written as a float ("0.5", "1e-3") and `actual` is within `tolerance`,
    absolute or relative (the usual "error at most 1e-6" judge). Integers always compare exactly."""
    if actual == expected:
        return True
    if not any(c in expected for c in ".eE") or expected.lower() in ("inf", "-inf", "nan"):
        return False
    try:
        got, want = float(actual), float(expected)
    except ValueError:
        return False
    return math.isfinite(got) and math.isfinite(want) and abs(got - want) <= tolerance * max(1.0, abs(want))


def same_output(actual: str, expected: str, float_tolerance: float | None = None) -> bool:
    """Whitespace-tolerant comparison: equal sequences of whitespace-separated tokens; with `float_tolerance`,
    tokens written as floats in `expected` may differ by that much (absolute, or relative above 1)."""
    got, want = actual.split(), expected.split()
    if float_tolerance is None or len(got) != len(want):
        return got == want
    return all(_close(a, b, float_tolerance) for a, b in zip(got, want, strict=True))


def check_io(
    code: str,
    cases: list[tuple[str, str]],
    *,
    timeout: float = 5.0,
    memory_mb: int = 512,
    partial: bool = True,
    stop_on_failure: bool = False,
    limits: Limits | None = None,
    allow_weak_isolation: bool = False,
    float_tolerance: float | None = None,
    time_budget: float | None = None,
) -> CodeResult:
    """Competitive-programming style: run `code` once per (stdin, expected stdout) case; `timeout` is per case.

    `time_budget` bounds all the cases together (seconds of wall clock): each case gets at most what is left, and
    the cases after it is spent fail as timeouts. A caller with a deadline of its own (the batch pool's item
    deadline) sets it below that deadline, so a slow program is failed tests, never a scorer timeout.
    """
    if not cases:
        raise ValueError("cases is empty: give at least one (stdin, expected_stdout) pair")
    if float_tolerance is not None and not 0 <= float_tolerance < 1:
        raise ValueError(f"float_tolerance must be in [0, 1), got {float_tolerance}")
    if time_budget is not None and time_budget <= 0:
        raise ValueError(f"time_budget must be > 0 seconds, got {time_budget}")
    for i, case in enumerate(cases):
        if not (isinstance(case, tuple | list) and len(case) == 2 and all(isinstance(s, str) for s in case)):
            raise ValueError(f"cases[{i}] must be a (stdin, expected_stdout) pair of strings")
    iso = require(allow_weak_isolation)
    chosen = limits or Limits(timeout=timeout, memory_mb=memory_mb)
    end = time.monotonic() + time_budget if time_budget is not None else math.inf
    tests: list[TestOutcome] = []
    first_bad: Run | None = None
    duration, stdout, stderr = 0.0, "", ""
    for i, case in enumerate(cases):
        left = end - time.monotonic()
        if stop_on_failure and first_bad is not None:
            tests.append(TestOutcome(index=i, passed=False, reason="skipped after a failure"))
            continue
        if left < 0.05:
            tests.append(TestOutcome(index=i, passed=False, reason="timeout (the task's time budget was spent)"))
            continue
        case_limits = chosen if left >= chosen.timeout else chosen.model_copy(update={"timeout": left})
        run = run_program({"kind": "script", "code": code}, mode=iso.mode, python=iso.python, limits=case_limits,
                          stdin=case[0])  # fmt: skip
        if run.status == "sandbox_error":
            raise SandboxError(f"the sandbox failed to start the program: {run.stderr[-1000:]}")
        duration += run.duration
        ok = run.status == "ok" and same_output(run.stdout, case[1], float_tolerance)
        reason = "" if ok else (f"wrong output: {run.stdout[:100]!r}" if run.status == "ok" else run.status)
        tests.append(TestOutcome(index=i, passed=ok, reason=reason))
        if not ok and first_bad is None:
            first_bad, stdout, stderr = run, run.stdout, run.stderr
    passed = sum(t.passed for t in tests)
    status: CodeStatus = "passed" if passed == len(cases) else "failed"
    if passed == 0 and first_bad is not None and first_bad.status != "ok":
        status = _RUN_STATUS.get(first_bad.status, "error")
    elif passed == 0 and first_bad is None:  # the budget ran out before any case ran
        status = "timeout"
    return CodeResult(
        passed=passed, total=len(cases), status=status, score=_score(passed, len(cases), partial), tests=tests,
        stdout=stdout[:2000], stderr=stderr[-2000:], duration=duration,
    )  # fmt: skip
