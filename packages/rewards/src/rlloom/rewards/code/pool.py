"""Check many solutions at once with a bounded pool of sandboxed runs.

Each run is a child process, so the pool holds threads that wait on children: `max_workers` bounds how many
programs run at the same time (default: one per CPU core). Results keep the input order; a task whose test data
is malformed comes back as an `error` result naming the problem instead of stopping the batch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from rlloom.rewards.code.harness import CodeResult, TestOutcome, check_asserts, check_function, check_io
from rlloom.rewards.code.probe import require
from rlloom.rewards.code.runner import Limits


class CodeTask(BaseModel):
    """One solution and its tests, in the shape of one of the three checkers."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["asserts", "function", "io"] = Field(description="Which checker: MBPP, HumanEval or stdin/stdout.")
    code: str = Field(description="The solution's source code.")
    asserts: list[str] = Field(default_factory=list, description="kind=asserts: assert statements.")
    setup: str = Field(default="", description="kind=asserts: code run before the asserts.")
    test: str = Field(default="", description="kind=function: source defining check(candidate).")
    entry_point: str = Field(default="", description="kind=function: the function check() receives.")
    helpers: str = Field(default="", description="kind=function: trusted task code the tests may use (the prompt).")
    cases: list[tuple[str, str]] = Field(default_factory=list, description="kind=io: (stdin, expected stdout).")
    limits: Limits = Field(default_factory=Limits, description="Resource limits (timeout per run or per case).")
    partial: bool = Field(default=True, description="Score passed/total (True) or all-or-nothing (False).")


def check_task(task: CodeTask, *, allow_weak_isolation: bool = False) -> CodeResult:
    """Run one task with the checker its `kind` names."""
    common = {"limits": task.limits, "partial": task.partial, "allow_weak_isolation": allow_weak_isolation}
    if task.kind == "asserts":
        return check_asserts(task.code, task.asserts, setup=task.setup, **common)  # type: ignore[arg-type]
    if task.kind == "function":
        return check_function(
            task.code,
            task.test,
            task.entry_point,
            helpers=task.helpers,
            **common,  # type: ignore[arg-type]
        )
    return check_io(task.code, task.cases, **common)  # type: ignore[arg-type]


def _guarded(task: CodeTask, allow_weak_isolation: bool) -> CodeResult:
    try:
        return check_task(task, allow_weak_isolation=allow_weak_isolation)
    except ValueError as exc:  # malformed test data: report it on this task, keep the batch going
        return CodeResult(
            passed=0, total=0, status="error", score=0.0, stderr=f"invalid task: {exc}",
            tests=[TestOutcome(index=0, passed=False, reason=str(exc))],
        )  # fmt: skip


def check_many(
    tasks: Sequence[CodeTask],
    *,
    max_workers: int | None = None,
    progress: bool = False,
    allow_weak_isolation: bool = False,
) -> list[CodeResult]:
    """Check every task, at most `max_workers` programs at a time; results in input order."""
    require(allow_weak_isolation)  # fail once, clearly, before starting any thread
    workers = max_workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"max_workers must be at least 1, got {max_workers}")
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlloom-code") as pool:
        futures = [pool.submit(_guarded, task, allow_weak_isolation) for task in tasks]
        return [f.result() for f in tqdm(futures, desc="code checks", disable=not progress, unit="prog")]
