"""Run one program as a script in the sandbox and say how it ended: `execute`, for callers that judge the output
themselves (the stdin/stdout checker does it per case)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rlloom.rewards.code.containment import SandboxError
from rlloom.rewards.code.probe import require
from rlloom.rewards.code.runner import ExecStatus, Limits, run_program


class ExecResult(BaseModel):
    """How one program run ended and what it printed (each stream capped)."""

    status: ExecStatus = Field(description="ok, error, timeout, memory, output_limit, killed or sandbox_error.")
    exit_code: int | None = Field(description="Exit status, or minus the signal number, None if unknown.")
    stdout: str = Field(description="Standard output, capped at Limits.output_bytes.")
    stderr: str = Field(description="Standard error, capped at a quarter of Limits.output_bytes.")
    duration: float = Field(description="Wall-clock seconds from start to the end of cleanup.")


def execute(
    code: str,
    *,
    stdin: str = "",
    timeout: float = 5.0,
    memory_mb: int = 512,
    limits: Limits | None = None,
    allow_weak_isolation: bool = False,
) -> ExecResult:
    """Run `code` as a script (`__main__`) in the sandbox and report how it ended.

    `limits` overrides `timeout` and `memory_mb` when given. Raises `WeakIsolationError` when only weak isolation
    is available and `allow_weak_isolation` is False, and `SandboxError` when the sandbox itself broke.
    """
    chosen = limits or Limits(timeout=timeout, memory_mb=memory_mb)
    iso = require(allow_weak_isolation)
    run = run_program({"kind": "script", "code": code}, mode=iso.mode, python=iso.python, limits=chosen, stdin=stdin)
    if run.status == "sandbox_error":
        raise SandboxError(f"the sandbox failed to start the program: {run.stderr[-1000:]}")
    return ExecResult(
        status=run.status, exit_code=run.exit_code, stdout=run.stdout, stderr=run.stderr, duration=run.duration
    )
