"""`CodeEnv`: a tool-calling environment whose one tool, `python`, runs code in rlloom-rewards' sandbox.

The model sends a whole program; it gets back stdout, then stderr, then how the run ended when it did not end
normally (exception, timeout, memory). A run that does not end normally counts as a tool error in the
metrics, but its output is still shown, since a traceback is exactly what the model needs to fix its code.
Tracebacks show the program's own frames only (the sandbox harness's are dropped) and no host paths; long
output is cut in the middle, here and by `max_obs_tokens`, because its last lines carry the error.
"""

from __future__ import annotations

import re

from rlloom.agent.envs.tool import ToolEnv
from rlloom.agent.rewards import AgentRubric
from rlloom.agent.tool_calls import ToolCallParser
from rlloom.agent.tools import Tool, ToolError, Toolset
from rlloom.rewards.code import ExecResult, WeakIsolationError, execute, isolation

CODE_SYSTEM_PROMPT = (
    "You can run Python code with the `python` tool; it returns what the program printed. "
    "Print every value you need to see."
)


PROGRAM_FILE = "solution.py"
"""The name rlloom-rewards' sandbox runs the program under (what its traceback frames say)."""

_FRAME = re.compile(r'^  File "(?P<path>[^"]*)", line \d+')
# everything up to the last lib/pythonX.Y/, site-packages/ or dist-packages/ of an absolute path
_LIB_PREFIX = re.compile(r"(?:[A-Za-z]:)?[/\\][^\s\"']*[/\\](?:site-packages|dist-packages|lib[/\\]python3\.\d+)[/\\]")


def clean_traceback(stderr: str) -> str:
    """`stderr` with the sandbox harness's frames dropped and host paths shortened (library paths relative to
    their site-packages or stdlib folder, any other absolute path to its file name)."""
    out: list[str] = []
    in_harness = False  # between "Traceback ..." and the program's first frame
    skipping_frame = False
    for line in stderr.split("\n"):
        if line.startswith("Traceback (most recent call last):"):
            in_harness, skipping_frame = True, False
            out.append(line)
            continue
        frame = _FRAME.match(line)
        if frame:
            path = frame.group("path")
            if path == PROGRAM_FILE:
                in_harness = False
            skipping_frame = in_harness
            if skipping_frame:
                continue
            if path.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", path):
                short = _LIB_PREFIX.sub("", path)
                line = line.replace(path, short if short != path else re.split(r"[/\\]", path)[-1], 1)
        elif skipping_frame and line.startswith("    "):
            continue  # the source line (and caret line) of a dropped frame
        else:
            skipping_frame = False
        out.append(_LIB_PREFIX.sub("", line))
    return "\n".join(out)


def cut_middle(text: str, max_chars: int) -> str:
    """`text` at most `max_chars` long, keeping its head and tail around a note of what was cut."""
    if len(text) <= max_chars:
        return text
    note = "\n[... {} characters cut ...]\n"
    room = max(0, max_chars - len(note.format(len(text))))
    head = room // 2
    cut = len(text) - room
    return text[:head] + note.format(cut) + text[len(text) - (room - head) :]


def format_run(result: ExecResult, max_chars: int = 4000) -> str:
    """The text the model sees for one run: stdout, stderr (cleaned) and, if abnormal, the ending; at most
    `max_chars`, cut in the middle so the error and the ending stay."""
    parts = [result.stdout.rstrip("\n")] if result.stdout else []
    if result.stderr:
        parts.append("stderr:\n" + clean_traceback(result.stderr).rstrip("\n"))
    if result.status != "ok":
        parts.append(f"[run ended: {result.status}, exit code {result.exit_code}]")
    return cut_middle("\n".join(parts) or "(no output)", max_chars)


def python_tool(
    *, timeout: float = 5.0, memory_mb: int = 512, allow_weak_isolation: bool = False, max_output_chars: int = 4000
) -> Tool:
    """A `python(code)` tool backed by `rlloom.rewards.code.execute` with these limits.

    Raises `WeakIsolationError` here, when the machine has only weak isolation and `allow_weak_isolation` is off:
    checked at each call instead, the refusal became a tool error every conversation showed its model (the host's
    setup advice as an observation), and a whole run trained on it with no sign but `tool_errors`.
    """
    found = isolation()
    if not found.strong and not allow_weak_isolation:
        raise WeakIsolationError(
            f"python_tool: this machine gives model code only weak isolation ({found.mode}: {found.reason}); "
            "run as root on Linux with util-linux (`unshare`), or pass allow_weak_isolation=True to "
            "python_toolset()/python_tool() to accept that model code could reach the network and write to /tmp"
        )

    def python(code: str) -> str:
        """Run a Python program in a sandbox and return its output.

        Args:
            code: a complete Python program; print what you want to see
        """
        result = execute(code, timeout=timeout, memory_mb=memory_mb, allow_weak_isolation=allow_weak_isolation)
        text = format_run(result, max_output_chars)
        if result.status != "ok":
            raise ToolError(text)
        return text

    return Tool(python)


def python_toolset(
    *,
    timeout: float = 5.0,
    memory_mb: int = 512,
    allow_weak_isolation: bool = False,
    max_threads: int = 16,
    max_output_chars: int = 4000,
) -> Toolset:
    """A shared `Toolset` holding only the sandboxed `python` tool (build once, share across conversations)."""
    tool = python_tool(
        timeout=timeout,
        memory_mb=memory_mb,
        allow_weak_isolation=allow_weak_isolation,
        max_output_chars=max_output_chars,
    )
    # a failed run's whole output is its error message: let it through uncut (format_run already bounds it)
    return Toolset([tool], timeout_s=timeout + 10.0, max_threads=max_threads, max_error_chars=max_output_chars)


class CodeEnv(ToolEnv):
    """`ToolEnv` over a `python_toolset()`, with a short system prompt that says how to use it."""

    def __init__(
        self,
        sandbox: Toolset,
        rubric: AgentRubric,
        *,
        parser: ToolCallParser | str | None = None,
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
            truncate="middle",
        )
