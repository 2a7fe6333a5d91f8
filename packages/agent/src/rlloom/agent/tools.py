"""Tools are plain Python functions; this module gives them a JSON schema and a safe way to be called.

The schema comes from type hints and the Google-style docstring (`Args:` section) through transformers'
`get_json_schema`, the same function chat templates use, so the model sees exactly what `apply_chat_template(
tools=...)` would render. Arguments are validated (and coerced, "3" -> 3) by pydantic's `validate_call`.
Every failure (unknown tool, bad arguments, the tool raising, a timeout) becomes a `ToolResult` with
`ok=False` and a message for the model: tool errors are observations, never exceptions in the rollout.
Sync tools run on a thread pool sized for many concurrent conversations, async tools on the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError, validate_call
from transformers.utils.chat_template_utils import (
    DocstringParsingException,
    TypeHintParsingException,
    get_json_schema,
)

from rlloom.agent.tool_calls import ToolCall


class ToolError(Exception):
    """Raise from a tool to report a failure to the model with exactly this message (counted as a tool error)."""


@dataclass(slots=True)
class ToolResult:
    """What a call produced: text for the model, and whether it succeeded."""

    name: str
    content: str
    ok: bool
    latency_s: float = 0.0


class Tool:
    """One callable tool: a function, its JSON schema, and an argument validator."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None) -> None:
        try:
            schema = get_json_schema(fn)
        except (DocstringParsingException, TypeHintParsingException) as exc:
            raise ValueError(
                f"tool {getattr(fn, '__name__', fn)!r}: cannot build its JSON schema ({exc}). Give every argument "
                "a type hint and describe each one in a Google-style docstring `Args:` section."
            ) from exc
        if name is not None:
            schema["function"]["name"] = name
        schema["function"].pop("return", None)  # chat templates and OpenAI schemas have no 'return' key
        self.fn = fn
        self.name: str = schema["function"]["name"]
        self.schema: dict[str, Any] = schema
        self.is_async = inspect.iscoroutinefunction(fn)
        self._validated = validate_call(fn)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


class Toolset:
    """The tools an environment offers, shared by all its conversations (and their thread pool)."""

    def __init__(
        self,
        tools: Sequence[Callable[..., Any] | Tool],
        *,
        timeout_s: float | None = 30.0,
        max_threads: int = 64,
        max_error_chars: int = 1000,
    ) -> None:
        self.tools: dict[str, Tool] = {}
        for item in tools:
            tool = item if isinstance(item, Tool) else Tool(item)
            if tool.name in self.tools:
                raise ValueError(f"Toolset: two tools are named {tool.name!r}; pass Tool(fn, name=...) to rename one")
            self.tools[tool.name] = tool
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"Toolset: timeout_s must be > 0 or None, got {timeout_s}")
        self.timeout_s = timeout_s
        self.max_error_chars = max_error_chars
        self._executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="rlloom-tool")

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style function schemas, as `apply_chat_template(tools=...)` expects."""
        return [t.schema for t in self.tools.values()]

    async def call(self, call: ToolCall) -> ToolResult:
        """Run one call; any failure becomes an error result the model can read."""
        start = time.perf_counter()
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "(none)"
            return ToolResult(call.name, f"Error: unknown tool {call.name!r}; available tools: {known}", False)
        try:
            if tool.is_async:
                coro = tool._validated(**call.arguments)
            else:
                loop = asyncio.get_running_loop()
                coro = loop.run_in_executor(self._executor, lambda: tool._validated(**call.arguments))
            value = await asyncio.wait_for(coro, self.timeout_s)
        except ValidationError as exc:
            msg = f"Error: invalid arguments for {call.name}: {_short_validation(exc)}"
            return ToolResult(call.name, msg, False, time.perf_counter() - start)
        except ToolError as exc:
            return ToolResult(call.name, str(exc), False, time.perf_counter() - start)
        except TimeoutError:
            msg = f"Error: {call.name} did not finish within {self.timeout_s} s"
            return ToolResult(call.name, msg, False, time.perf_counter() - start)
        except Exception as exc:  # a tool failing is information for the model, not a crash of the rollout
            text = f"Error: {call.name} raised {type(exc).__name__}: {exc}"
            return ToolResult(call.name, text[: self.max_error_chars], False, time.perf_counter() - start)
        return ToolResult(call.name, _as_text(value), True, time.perf_counter() - start)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _short_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "arguments"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
