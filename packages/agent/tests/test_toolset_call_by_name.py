"""`Toolset.call` by tool name and arguments (dict, JSON text or none), as adapters call it, equals the
`ToolCall` form; unusable arguments are error results for the model, misuse of the API is a TypeError."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rlloom.agent.tool_calls import ToolCall
from rlloom.agent.tools import ToolResult, Toolset


def add(a: int, b: int = 1) -> int:
    """Add two integers.

    Args:
        a: first addend
        b: second addend
    """
    return a + b


def now() -> str:
    """The fixed time."""
    return "12:00"


def run(toolset: Toolset, *args: Any) -> ToolResult:
    return asyncio.run(toolset.call(*args))


def test_a_call_by_name_equals_the_same_tool_call() -> None:
    toolset = Toolset([add, now])
    try:
        by_call = run(toolset, ToolCall("add", {"a": 2, "b": 3}))
        assert (by_call.name, by_call.content, by_call.ok) == ("add", "5", True)
        for arguments in ({"a": 2, "b": 3}, '{"a": 2, "b": 3}', ' {"a": "2", "b": 3} '):
            result = run(toolset, "add", arguments)
            assert (result.name, result.content, result.ok) == ("add", "5", True), arguments
        assert run(toolset, "add", {"a": 4}).content == "5"  # the default b=1
        for empty in (None, "", "  "):  # no arguments at all
            assert (run(toolset, "now", empty).content, run(toolset, "now").ok) == ("12:00", True)
    finally:
        toolset.close()


def test_unusable_arguments_by_name_are_error_results_naming_the_tool() -> None:
    toolset = Toolset([add])
    try:
        bad_json = run(toolset, "add", '{"a": 2,')
        assert not bad_json.ok
        assert bad_json.content.startswith("Error: invalid arguments for add: arguments are not valid JSON")
        not_object = run(toolset, "add", "[1, 2]")
        assert not not_object.ok and "must be a JSON object of named arguments, got list" in not_object.content
        missing = run(toolset, "add", {})
        assert not missing.ok and missing.content == "Error: invalid arguments for add: a: Missing required argument"
        as_bool = run(toolset, "add", {"a": True})  # JSON true is never the number 1, by name as by ToolCall
        assert not as_bool.ok and "a: Input should be a number, not a boolean" in as_bool.content
        unknown = run(toolset, "sub", "{not json")  # an unknown tool is reported as unknown, whatever the arguments
        assert not unknown.ok and unknown.content == "Error: unknown tool 'sub'; available tools: add"
    finally:
        toolset.close()


def test_misusing_the_call_api_is_a_type_error() -> None:
    toolset = Toolset([add])
    try:
        with pytest.raises(TypeError, match="either a ToolCall or a tool name and arguments, not both"):
            run(toolset, ToolCall("add", {"a": 1}), {"a": 2})
        with pytest.raises(TypeError, match="must be a ToolCall or a tool name"):
            run(toolset, 42)
    finally:
        toolset.close()
