"""Tools are plain Python functions; this module gives them a JSON schema and a safe way to be called.

The schema comes from type hints and the Google-style docstring (`Args:` section) through transformers'
`get_json_schema`, the same function chat templates use, so the model sees exactly what `apply_chat_template(
tools=...)` would render. Arguments are validated (and coerced, "3" -> 3, but never true -> 1) by pydantic's
`validate_call`. Only functions a JSON call can reach are accepted: named parameters, no `*args`/`**kwargs`,
no unbound `self`. Results become text: strings as-is, bytes decoded, anything else as JSON (NaN/inf -> null;
dataclasses and pydantic models as objects).
Every failure (unknown tool, bad arguments, the tool raising or calling sys.exit, a timeout) becomes a `ToolResult`
with `ok=False` and a message for the model: tool errors are observations, never exceptions in the rollout.
Sync tools run on a thread pool sized for many concurrent conversations, async tools on the event loop.
"""

from __future__ import annotations

import asyncio
import collections.abc
import functools
import inspect
import json
import math
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError, validate_call
from pydantic_core import to_jsonable_python
from transformers.utils.chat_template_utils import (
    DocstringParsingException,
    TypeHintParsingException,
    get_json_schema,
)

from rlloom.agent.tool_calls import ToolCall


class ToolError(Exception):
    """Raise from a tool to report a failure to the model with exactly this message (counted as a tool error)."""


class _ToolExitError(Exception):
    """A tool's `SystemExit` (argparse exits on a wrapped CLI's bad arguments) as an ordinary error: raised inside
    an asyncio task, SystemExit would stop the event loop, and every conversation with it."""


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
        _check_callable_by_json(fn)
        try:
            schema = get_json_schema(fn)
        except (DocstringParsingException, TypeHintParsingException, TypeError) as exc:
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
        self._hints = _parameter_hints(fn)

    def bool_for_number(self, arguments: dict[str, Any]) -> str | None:
        """The error for a JSON true/false given where a number goes (pydantic would take it as 1/0): an int/float
        parameter, or an element of a list/tuple/set or a value of a dict of numbers."""
        bad = [
            p
            for name, hint in self._hints.items()
            if name in arguments
            for p in _bools_for_numbers(hint, arguments[name], name)
        ]
        if not bad:
            return None
        return "; ".join(f"{k}: Input should be a number, not a boolean" for k in bad)


def _check_callable_by_json(fn: Callable[..., Any]) -> None:
    """Refuse functions a JSON tool call (named arguments only) could never call correctly."""
    what = getattr(fn, "__qualname__", None) or repr(fn)
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        name = getattr(fn, "__name__", what)
        raise ValueError(
            f"tool {name!r} is a generator function: calling it returns an iterator, not its values (the model "
            "would read '<generator object ...>'); return a list or a string instead"
        )
    if not isinstance(fn, functools.partial) and not inspect.isroutine(fn) and not inspect.isclass(fn):
        kind = type(fn).__name__
        raise ValueError(
            f"tool {kind!r} instance: a callable object has no tool name of its own and its schema would come from "
            f"the class docstring; pass its method with a name instead, e.g. Tool(obj.__call__, name={kind.lower()!r})"
        )
    if isinstance(fn, functools.partial):
        raise ValueError(
            f"tool {getattr(fn.func, '__name__', fn.func)!r}: functools.partial is not supported (its schema "
            "cannot be built); write a small function with the remaining arguments, type hints and a docstring "
            "that calls it"
        )
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"tool {what!r}: cannot read its signature ({exc}); wrap it in a plain function") from exc
    for p in params:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            star = "*" if p.kind is inspect.Parameter.VAR_POSITIONAL else "**"
            raise ValueError(
                f"tool {what!r}: parameter {star}{p.name} cannot be filled by a JSON tool call (arguments are "
                f"named); use a list or dict parameter instead, e.g. `{p.name}: list[int]`"
            )
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ValueError(f"tool {what!r}: positional-only parameter {p.name!r} cannot be passed by name")
    if params and params[0].name in ("self", "cls") and not inspect.ismethod(fn):
        raise ValueError(
            f"tool {what!r}: looks like an unbound method (first parameter {params[0].name!r}); pass a bound method "
            "of an instance instead, e.g. Tool(Calc().mul)"
        )


def _parameter_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Each parameter's type hint ({} when they cannot be resolved: pydantic alone then checks the arguments)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return {}
    hints.pop("return", None)
    return hints


_UNIONS = (typing.Union, type(int | None))
_SEQUENCES = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set)
_MAPPINGS = (dict, collections.abc.Mapping)


def _bools_for_numbers(hint: Any, value: Any, path: str) -> list[str]:
    """Where in `value` a JSON boolean stands for a number of `hint` (int/float, alone or in unions and
    containers); a union that admits bool takes it as given."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _bools_for_numbers(args[0], value, path)
    if origin in _UNIONS:
        if bool in args:
            return []
        if isinstance(value, bool):
            return [path] if any(option in (int, float) for option in args) else []
        return next((found for option in args if (found := _bools_for_numbers(option, value, path))), [])
    if isinstance(value, bool):
        return [path] if hint in (int, float) else []
    if origin in _SEQUENCES and isinstance(value, list) and args:
        fixed = origin is tuple and Ellipsis not in args  # tuple[int, bool]: one hint per position
        hints = [args[i] if fixed and i < len(args) else args[0] for i in range(len(value))]
        return [
            p
            for i, (h, v) in enumerate(zip(hints, value, strict=True))
            for p in _bools_for_numbers(h, v, f"{path}.{i}")
        ]
    if origin in _MAPPINGS and isinstance(value, dict) and len(args) == 2:
        return [p for k, v in value.items() for p in _bools_for_numbers(args[1], v, f"{path}.{k}")]
    return []


def _as_text(value: Any) -> str:
    """Strings as-is, bytes decoded, anything else as JSON: dataclasses, pydantic models, enums and dates become
    JSON objects and strings (pydantic's own conversion) rather than a quoted Python repr."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    try:
        jsonable = _json_safe(to_jsonable_python(_json_safe(value), fallback=str))  # NaN inside a model too
        return json.dumps(jsonable, ensure_ascii=False, default=str, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)


def _json_safe(value: Any) -> Any:
    """`value` with NaN/inf as null and bytes as text, so the result is valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    return value


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
        """`max_error_chars` caps every error message, `ToolError`s included (the tool's own text)."""
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

    async def call(self, call: ToolCall | str, arguments: Mapping[str, Any] | str | None = None) -> ToolResult:
        """Run one call; any failure becomes an error result the model can read.

        The call is a parsed `ToolCall`, or a tool name with its `arguments`: a mapping, the JSON object text an
        OpenAI-style API returns in `function.arguments`, or None for no arguments (what adapters such as
        verifiers or TRL tools hand over, without building a `ToolCall` first).
        """
        start = time.perf_counter()
        if isinstance(call, ToolCall):
            if arguments is not None:
                raise TypeError("Toolset.call: give either a ToolCall or a tool name and arguments, not both")
        elif isinstance(call, str):
            parsed = _arguments_of(arguments)
            if isinstance(parsed, str) and call in self.tools:  # an unknown name is reported as such, below
                return self._failed(ToolCall(call, {}), f"Error: invalid arguments for {call}: {parsed}", start)
            call = ToolCall(call, parsed if isinstance(parsed, dict) else {})
        else:
            raise TypeError(f"Toolset.call: call must be a ToolCall or a tool name (str), got {type(call).__name__}")
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "(none)"
            shown = call.name if len(call.name) <= 100 else call.name[:100] + "..."  # keep the list of tools in view
            return self._failed(call, f"Error: unknown tool {shown!r}; available tools: {known}", start)
        bad = tool.bool_for_number(call.arguments)
        if bad is not None:
            return self._failed(call, f"Error: invalid arguments for {call.name}: {bad}", start)
        try:
            value = await asyncio.wait_for(self._invoke(tool, call.arguments), self.timeout_s)
        except ValidationError as exc:
            return self._failed(call, f"Error: invalid arguments for {call.name}: {_short_validation(exc)}", start)
        except ToolError as exc:
            return self._failed(call, str(exc), start)
        except TimeoutError:
            return self._failed(call, f"Error: {call.name} did not finish within {self.timeout_s} s", start)
        except _ToolExitError as exc:
            return self._failed(call, f"Error: {call.name} exited (SystemExit {exc})", start)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the conversation itself is being cancelled
            # the tool's own awaits were cancelled under it: left as is, asyncio would drop the conversation
            return self._failed(call, f"Error: {call.name} was cancelled before it returned", start)
        except Exception as exc:  # a tool failing is information for the model, not a crash of the rollout
            return self._failed(call, f"Error: {call.name} raised {type(exc).__name__}: {exc}", start)
        return ToolResult(call.name, _as_text(value), True, time.perf_counter() - start)

    def _failed(self, call: ToolCall, text: str, start: float) -> ToolResult:
        """An error result, cut to `max_error_chars`: the text may quote what the model wrote (a tool name,
        hundreds of bad list items), which must not flood its context."""
        return ToolResult(call.name, text[: self.max_error_chars], False, time.perf_counter() - start)

    async def _invoke(self, tool: Tool, arguments: dict[str, Any]) -> Any:
        """The tool's value: async tools on the event loop, sync ones on the thread pool. A sync function that
        returns an awaitable (an async tool under a plain decorator, which hides that it is async) is awaited
        too, rather than handing the model the text of an unawaited coroutine."""
        try:
            if tool.is_async:
                value = await tool._validated(**arguments)
            else:
                loop = asyncio.get_running_loop()
                value = await loop.run_in_executor(self._executor, lambda: tool._validated(**arguments))
            if inspect.isawaitable(value):
                value = await value
        except SystemExit as exc:
            raise _ToolExitError(exc.code) from None
        return value

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _arguments_of(arguments: Mapping[str, Any] | str | None) -> dict[str, Any] | str:
    """The arguments of a call by name as a dict, or the reason they are unusable (shown to the model)."""
    if arguments is None:
        return {}
    if isinstance(arguments, str):
        text = arguments.strip()
        if not text:
            return {}
        try:
            arguments = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"arguments are not valid JSON ({exc.msg} at position {exc.pos}); give a JSON object"
    if not isinstance(arguments, Mapping):
        return f"arguments must be a JSON object of named arguments, got {type(arguments).__name__}"
    bad_keys = [k for k in arguments if not isinstance(k, str)]
    if bad_keys:
        return f"argument names must be strings, got {bad_keys[:5]!r}"
    return dict(arguments)


def _short_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "arguments"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
