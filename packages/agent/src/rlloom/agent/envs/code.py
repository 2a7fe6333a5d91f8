"""`CodeEnv`: a tool-calling environment whose one tool, `python`, runs code in rlloom-rewards' sandbox.

The model sends a whole program; it gets back stdout, then stderr, then how the run ended when it did not end
normally (exception, timeout, memory). A run that does not end normally counts as a tool error in the
metrics, but its output is still shown, since a traceback is exactly what the model needs to fix its code.
"""

from __future__ import annotations

from rlloom.agent.envs.tool import ToolEnv
from rlloom.agent.rewards import AgentRubric
from rlloom.agent.tool_calls import ToolCallParser
from rlloom.agent.tools import Tool, ToolError, Toolset
from rlloom.rewards.code import ExecResult, execute

CODE_SYSTEM_PROMPT = (
    "You can run Python code with the `python` tool; it returns what the program printed. "
    "Print every value you need to see."
)


def format_run(result: ExecResult, max_chars: int = 4000) -> str:
    """The text the model sees for one run: stdout, stderr and, if abnormal, the ending."""
    parts = [result.stdout.rstrip("\n")] if result.stdout else []
    if result.stderr:
        parts.append("stderr:\n" + result.stderr.rstrip("\n"))
    if result.status != "ok":
        parts.append(f"[run ended: {result.status}, exit code {result.exit_code}]")
    text = "\n".join(parts) or "(no output)"
    return text if len(text) <= max_chars else text[:max_chars] + "\n[output truncated]"


def python_tool(*, timeout: float = 5.0, memory_mb: int = 512, allow_weak_isolation: bool = False) -> Tool:
    """A `python(code)` tool backed by `rlloom.rewards.code.execute` with these limits."""

    def python(code: str) -> str:
        """Run a Python program in a sandbox and return its output.

        Args:
            code: a complete Python program; print what you want to see
        """
        result = execute(code, timeout=timeout, memory_mb=memory_mb, allow_weak_isolation=allow_weak_isolation)
        text = format_run(result)
        if result.status != "ok":
            raise ToolError(text)
        return text

    return Tool(python)


def python_toolset(
    *, timeout: float = 5.0, memory_mb: int = 512, allow_weak_isolation: bool = False, max_threads: int = 16
) -> Toolset:
    """A shared `Toolset` holding only the sandboxed `python` tool (build once, share across conversations)."""
    tool = python_tool(timeout=timeout, memory_mb=memory_mb, allow_weak_isolation=allow_weak_isolation)
    return Toolset([tool], timeout_s=timeout + 10.0, max_threads=max_threads)


class CodeEnv(ToolEnv):
    """`ToolEnv` over a `python_toolset()`, with a short system prompt that says how to use it."""

    def __init__(
        self,
        sandbox: Toolset,
        rubric: AgentRubric,
        *,
        parser: ToolCallParser | None = None,
        system_prompt: str | None = CODE_SYSTEM_PROMPT,
        template: str = "{question}",
        max_calls_per_turn: int = 4,
    ) -> None:
        if "python" not in sandbox.tools:
            raise ValueError("CodeEnv: the toolset has no `python` tool; build it with python_toolset()")
        super().__init__(
            sandbox,
            rubric,
            parser=parser,
            system_prompt=system_prompt,
            template=template,
            max_calls_per_turn=max_calls_per_turn,
        )
