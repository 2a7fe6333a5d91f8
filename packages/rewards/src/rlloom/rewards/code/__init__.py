"""Sandboxed code execution and honest test checking for code rewards (HumanEval, MBPP, stdin/stdout tasks).

`execute` runs a program; `check_asserts`, `check_function`, `check_calls` and `check_io` judge a solution
against tests; `check_many` runs many in parallel; `humaneval_scorer`, `mbpp_scorer` and `io_scorer` plug into
the rewards registry. `isolation()` reports what the sandbox verified on this machine.
"""

from rlloom.rewards.code.containment import SandboxError, WeakIsolationError
from rlloom.rewards.code.execute import ExecResult, execute
from rlloom.rewards.code.harness import (
    CodeResult,
    MissingHelpersError,
    TestOutcome,
    check_asserts,
    check_calls,
    check_function,
    check_io,
)
from rlloom.rewards.code.pool import CodeTask, check_many, check_task
from rlloom.rewards.code.probe import Isolation, isolation
from rlloom.rewards.code.runner import Limits
from rlloom.rewards.code.scorers import extract_code, humaneval_scorer, io_scorer, mbpp_scorer

__all__ = [
    "CodeResult",
    "CodeTask",
    "ExecResult",
    "Isolation",
    "Limits",
    "MissingHelpersError",
    "SandboxError",
    "TestOutcome",
    "WeakIsolationError",
    "check_asserts",
    "check_calls",
    "check_function",
    "check_io",
    "check_many",
    "check_task",
    "execute",
    "extract_code",
    "humaneval_scorer",
    "io_scorer",
    "isolation",
    "mbpp_scorer",
]
