"""Parsers, tool schemas and tool execution, each against hand-written expectations."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import json
from typing import Any

import pytest
from pydantic import BaseModel

from rlloom.agent.environment import Observation, Prompt, Sample
from rlloom.agent.parsers import XMLParser, extract_answer, first_action, last_tag_content
from rlloom.agent.tool_calls import HermesToolCallParser, ToolCall
from rlloom.agent.tools import Tool, ToolError, Toolset


def test_xml_parser_tolerates_whitespace_and_reports_problems() -> None:
    parser = XMLParser(["think", "answer"], non_empty=["answer"])
    ok = parser.parse("< think >\n plan \n</think>\n<ANSWER> 42 </ answer>")
    assert ok.format_ok
    assert [(b.tag, b.content) for b in ok.blocks] == [("think", "plan"), ("answer", "42")]
    bad = parser.parse("<think>a<answer></answer>")
    assert not bad.format_ok
    assert "<think> opened 1 times but closed 0 times" in bad.problems
    assert "<answer> is empty" in bad.problems
    nested = parser.parse("<think> x <answer>1</answer> </think>")
    assert "<answer> is nested inside <think>" in nested.problems
    with pytest.raises(ValueError, match="not a valid tag name"):
        XMLParser(["a b"])


def test_first_action_follows_search_r1() -> None:
    assert first_action("<think>x</think><search> q1 </search><answer>a</answer>") == ("search", "q1")
    assert first_action("<answer>\n Paris \n</answer><search>q</search>") == ("answer", "Paris")
    assert first_action("<search>unclosed") is None
    assert first_action("<query>q</query>", ("query", "final")) == ("query", "q")


def test_answer_hooks_take_the_last_block() -> None:
    assert extract_answer("<answer>1</answer> then <answer> 2 </answer>") == "2"
    assert extract_answer("no answer") is None
    assert last_tag_content("final")("<final>x</final>") == "x"


def test_hermes_parser_valid_malformed_and_unclosed() -> None:
    parser = HermesToolCallParser()
    text = (
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
        '<tool_call>{"name": "g", "arguments": "{\\"y\\": 2}"}</tool_call>'
        "<tool_call>[1]</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "h"'
    )
    parsed = parser.parse(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("f", {"x": 1}), ("g", {"y": 2})]
    assert list(parsed.errors) == [
        'tool call must be a JSON object like {"name": ..., "arguments": {...}}',
        'tool call has no "name" string',
        "a <tool_call> block was not closed with </tool_call>",
    ]
    assert not parser.parse("just text").found_any


def test_hermes_parser_reads_null_arguments_as_none_given() -> None:
    parsed = HermesToolCallParser().parse(
        '<tool_call>{"name": "now", "arguments": null}</tool_call><tool_call>{"name": "f", "arguments": 3}</tool_call>'
    )
    assert [(c.name, c.arguments) for c in parsed.calls] == [("now", {})]
    assert list(parsed.errors) == ["tool call 'f': \"arguments\" must be a JSON object"]


def lookup(key: str, limit: int = 2) -> list[str]:
    """Find entries.

    Args:
        key: what to find
        limit: how many entries at most
    """
    if key == "boom":
        raise RuntimeError("backend down")
    if key == "fail":
        raise ToolError("nothing matched 'fail'")
    return [key] * limit


def test_tool_schema_comes_from_hints_and_docstring() -> None:
    tool = Tool(lookup)
    assert tool.schema == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Find entries.",
            "parameters": {
                "type": "object",
                "properties": {
                    "key": {"type": "string", "description": "what to find"},
                    "limit": {"type": "integer", "description": "how many entries at most"},
                },
                "required": ["key"],
            },
        },
    }

    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="describe each one in a Google-style docstring"):
        Tool(undocumented)
    with pytest.raises(ValueError, match="two tools are named 'lookup'"):
        Toolset([lookup, lookup])


def test_toolset_turns_every_failure_into_an_error_result() -> None:
    toolset = Toolset([lookup])

    async def run(call: ToolCall) -> Any:
        return await toolset.call(call)

    ok = asyncio.run(run(ToolCall("lookup", {"key": "a", "limit": "3"})))
    assert (ok.ok, ok.content) == (True, '["a", "a", "a"]')
    bad_args = asyncio.run(run(ToolCall("lookup", {"limit": "many"})))
    assert not bad_args.ok
    assert bad_args.content.startswith("Error: invalid arguments for lookup: key: Missing required argument; limit:")
    raised = asyncio.run(run(ToolCall("lookup", {"key": "boom"})))
    assert raised.content == "Error: lookup raised RuntimeError: backend down"
    failed = asyncio.run(run(ToolCall("lookup", {"key": "fail"})))
    assert (failed.ok, failed.content) == (False, "nothing matched 'fail'")
    toolset.close()


def test_sample_reads_verl_and_flat_rows() -> None:
    verl = Sample.from_row(
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": "Q?"}],
            "reward_model": {"ground_truth": {"target": ["a"]}},
            "extra_info": {"index": 3},
            "ability": "fact-reasoning",
        }
    )
    assert verl.ground_truth == {"target": ["a"]}
    assert verl.extra_info == {"index": 3, "ability": "fact-reasoning"}
    flat = Sample.from_row({"question": "q", "golden_answers": ["x", "y"]})
    assert flat.ground_truth == ["x", "y"]
    with pytest.raises(ValueError, match="neither 'question' nor 'prompt'"):
        Sample.from_row({"answer": "x"})


def test_sample_reads_prompts_as_the_trainer_does() -> None:
    """One reading of rows for every collector (core-rl's `prompt_messages` and `ground_truth`): TRL's string
    prompt is one user message here too (it was refused here and accepted by single-turn training)."""
    from rlloom.core_rl.contracts.generation import SamplingParams
    from rlloom.core_rl.data.loader import generation_request

    row = {"prompt": "What is 2+3?", "answer": "5"}
    assert Sample.from_row(row).prompt == [{"role": "user", "content": "What is 2+3?"}]
    assert Sample.from_row(row).prompt == generation_request(row, SamplingParams()).messages
    assert Sample.from_row(row).ground_truth == "5"
    with pytest.raises(ValueError, match=r"`prompt` holds 'hi', not a chat message with 'role' and 'content'"):
        Sample.from_row({"prompt": [{"role": "user", "content": "q"}, "hi"], "answer": "5"})
    with pytest.raises(ValueError, match="`prompt` is an empty string"):
        Sample.from_row({"prompt": "", "answer": "5"})
    numpy_like = Sample.from_row({"prompt": ({"role": "user", "content": "q"},), "answer": "5"})
    assert numpy_like.prompt == [{"role": "user", "content": "q"}]


def test_prompt_and_observation_need_exactly_one_form() -> None:
    with pytest.raises(ValueError, match="exactly one of `messages` or `text`"):
        Prompt()
    with pytest.raises(ValueError, match="exactly one of `text` or `messages`"):
        Observation(text="a", messages=[{"role": "tool", "content": "b"}])
    with pytest.raises(ValueError, match="messages is empty"):
        Observation(messages=[])


def test_hermes_parser_keeps_call_order_with_malformed_blocks() -> None:
    parsed = HermesToolCallParser().parse(
        '<tool_call>{not json}</tool_call><tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    )
    assert [b if isinstance(b, str) else b.name for b in parsed.blocks] == [
        "tool call is not valid JSON (Expecting property name enclosed in double quotes at position 1): {not json}",
        "f",
    ]


class Calc:
    def mul(self, a: int, b: int) -> int:
        """Multiply.

        Args:
            a: left
            b: right
        """
        return a * b


def test_callable_objects_are_refused_with_the_way_to_pass_them() -> None:
    class Calc:
        """A calculator."""

        def __call__(self, a: int, b: int) -> int:
            """Add two numbers.

            Args:
                a: first
                b: second
            """
            return a + b

    with pytest.raises(ValueError, match=r"Tool\(obj.__call__, name='calc'\)"):
        Tool(Calc())  # was "no docstring for operation"-style schema errors
    tool = Tool(Calc().__call__, name="calc")  # the way the message gives works
    assert tool.schema["function"]["name"] == "calc"
    assert tool.schema["function"]["description"] == "Add two numbers."
    toolset = Toolset([tool])
    assert asyncio.run(toolset.call(ToolCall("calc", {"a": 2, "b": 3}))).content == "5"
    toolset.close()


def test_tool_refuses_functions_a_json_call_cannot_reach() -> None:
    def total(*xs: int) -> int:
        """Sum.

        Args:
            xs: numbers
        """
        return sum(xs)

    def configure(**opts: str) -> str:
        """Configure.

        Args:
            opts: options
        """
        return str(opts)

    with pytest.raises(ValueError, match=r"parameter \*xs cannot be filled by a JSON tool call"):
        Tool(total)
    with pytest.raises(ValueError, match=r"parameter \*\*opts cannot be filled"):
        Tool(configure)
    with pytest.raises(ValueError, match=r"unbound method .*Tool\(Calc\(\)\.mul\)"):
        Tool(Calc.mul)
    with pytest.raises(ValueError, match="functools.partial is not supported"):
        Tool(functools.partial(lookup, limit=1))
    bound = Tool(Calc().mul)  # a bound method is a normal tool
    assert bound.schema["function"]["parameters"]["required"] == ["a", "b"]
    toolset = Toolset([bound])
    assert asyncio.run(toolset.call(ToolCall("mul", {"a": 6, "b": 7}))).content == "42"
    toolset.close()


@dataclasses.dataclass
class Hit:
    title: str
    score: float


class Page(BaseModel):
    """A structured tool result (module level: the tool's schema resolves its return annotation)."""

    hits: list[Hit]
    day: datetime.date


def test_tool_results_are_valid_text_and_bools_are_not_numbers() -> None:
    def raw() -> bytes:
        """Raw bytes."""
        return b"caf\xc3\xa9 \xff"

    def stats() -> dict[str, Any]:
        """Stats."""
        return {"mean": float("nan"), "max": float("inf"), "rows": [1.5, float("-inf")], "blob": b"ok"}

    def long_failure() -> str:
        """Fail verbosely."""
        raise ToolError("e" * 3000)

    def scale(x: float, times: int | None = None) -> float:
        """Scale.

        Args:
            x: value
            times: factor
        """
        return x * (times or 1)

    def search() -> Page:
        """Search."""
        return Page(hits=[Hit("Paris", 1.5), Hit("Lyon", float("nan"))], day=datetime.date(2024, 5, 1))

    toolset = Toolset([raw, stats, long_failure, scale, search], max_error_chars=100)

    def call(name: str, **args: Any) -> Any:
        return asyncio.run(toolset.call(ToolCall(name, args)))

    assert call("raw").content == "café \ufffd"
    text = call("stats").content
    assert json.loads(text) == {"mean": None, "max": None, "rows": [1.5, None], "blob": "ok"}
    assert "NaN" not in text and "Infinity" not in text
    # structured results reach the model as JSON objects, not a Python repr such as "Page(hits=[Hit(...)])"
    assert json.loads(call("search").content) == {
        "hits": [{"title": "Paris", "score": 1.5}, {"title": "Lyon", "score": None}],
        "day": "2024-05-01",
    }
    failed = call("long_failure")
    assert (failed.ok, failed.content) == (False, "e" * 100)
    assert call("scale", x="2", times=3).content == "6.0"  # strings still coerce
    for args in ({"x": True}, {"x": 1.0, "times": False}):
        refused = call("scale", **args)
        assert not refused.ok
        assert "Input should be a number, not a boolean" in refused.content
    toolset.close()


def test_bools_are_not_numbers_inside_lists_and_dicts_either() -> None:
    """README: a boolean is refused for int/float. Inside `list[float]` or `dict[str, int]` pydantic took
    `true` as 1.0 and the tool ran on it."""

    def total(values: list[float], weights: dict[str, int] | None = None, flags: list[bool] | None = None) -> float:
        """Sum.

        Args:
            values: numbers to add
            weights: optional integer weights by name
            flags: switches (booleans are right here)
        """
        return sum(values) + sum((weights or {}).values()) + len(flags or [])

    toolset = Toolset([total])

    def call(**args: Any) -> Any:
        return asyncio.run(toolset.call(ToolCall("total", args)))

    assert call(values=[1, "2.5"], weights={"a": 3}, flags=[True, False]).content == "8.5"  # 1 + 2.5 + 3 + 2
    refused = call(values=[1.0, True])
    assert not refused.ok and "values.1: Input should be a number, not a boolean" in refused.content
    refused = call(values=[1.0], weights={"a": 2, "b": False})
    assert not refused.ok and "weights.b: Input should be a number, not a boolean" in refused.content
    toolset.close()


def _logged(fn: Any) -> Any:
    """A plain decorator, as users write them: its sync wrapper hides that `fn` is async."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


@_logged
async def fetch(url: str) -> dict[str, Any]:
    """Fetch a page.

    Args:
        url: the address
    """
    await asyncio.sleep(0)
    return {"url": url, "status": 200}


@_logged
async def stall(seconds: float) -> str:
    """Wait.

    Args:
        seconds: how long
    """
    await asyncio.sleep(seconds)
    return "done"


def test_an_async_tool_under_a_plain_decorator_is_awaited_and_timed_out() -> None:
    """The wrapper returns a coroutine; the model must see its result, not '<coroutine object fetch ...>'."""
    toolset = Toolset([fetch, stall], timeout_s=0.2)

    async def run() -> list[Any]:
        return [
            await toolset.call(ToolCall("fetch", {"url": "a.b"})),
            await toolset.call(ToolCall("stall", {"seconds": 30})),
        ]

    fetched, stalled = asyncio.run(run())
    toolset.close()
    assert (fetched.ok, fetched.content) == (True, '{"url": "a.b", "status": 200}')
    assert (stalled.ok, stalled.content) == (False, "Error: stall did not finish within 0.2 s")


def test_unknown_tools_and_bad_arguments_are_capped_at_max_error_chars() -> None:
    """A model can write a 10,000-character tool name or a list of 500 wrong items: the error it reads back must
    stay within max_error_chars like every other error, not flood its context."""

    def tag(words: list[str]) -> str:
        """Tag words.

        Args:
            words: the words
        """
        return " ".join(words)

    toolset = Toolset([tag], max_error_chars=120)

    async def run() -> list[Any]:
        return [
            await toolset.call(ToolCall("x" * 10_000, {})),
            await toolset.call(ToolCall("tag", {"words": [1] * 500})),
        ]

    unknown, invalid = asyncio.run(run())
    toolset.close()
    assert not unknown.ok and not invalid.ok
    assert len(unknown.content) <= 120 and unknown.content.startswith("Error: unknown tool 'xxx")
    assert len(invalid.content) <= 120
    assert invalid.content.startswith("Error: invalid arguments for tag: words.0: Input should be a valid string")


def test_a_tool_that_calls_sys_exit_is_an_error_not_the_end_of_the_run() -> None:
    """argparse ends a wrapped CLI's bad arguments with sys.exit(2): that is the tool failing, and must not stop
    the event loop (every conversation) or the process."""

    def cli(argv: list[str]) -> str:
        """Run a command line.

        Args:
            argv: its arguments
        """
        import argparse

        parser = argparse.ArgumentParser(prog="cli")
        parser.add_argument("--n", type=int, required=True)
        return str(parser.parse_args(argv).n)

    async def quit_now(code: int) -> str:
        """Exit.

        Args:
            code: exit status
        """
        raise SystemExit(code)

    toolset = Toolset([cli, quit_now])

    async def run() -> list[Any]:
        return [
            await toolset.call(ToolCall("cli", {"argv": ["--n", "x"]})),
            await toolset.call(ToolCall("quit_now", {"code": 3})),
            await toolset.call(ToolCall("cli", {"argv": ["--n", "4"]})),
        ]

    exited, quit_result, fine = asyncio.run(run())
    toolset.close()
    assert (exited.ok, exited.content) == (False, "Error: cli exited (SystemExit 2)")
    assert (quit_result.ok, quit_result.content) == (False, "Error: quit_now exited (SystemExit 3)")
    assert (fine.ok, fine.content) == (True, "4")


def test_a_tool_cancelled_from_inside_is_an_error_result() -> None:
    """An async tool whose own awaits were cancelled (a client library giving up) raises CancelledError; asyncio
    would then treat the whole conversation as cancelled and drop it without a word."""

    async def fetch(url: str) -> str:
        """Fetch a page.

        Args:
            url: the address
        """
        raise asyncio.CancelledError()

    toolset = Toolset([fetch])
    result = asyncio.run(toolset.call(ToolCall("fetch", {"url": "a.b"})))
    toolset.close()
    assert (result.ok, result.content) == (False, "Error: fetch was cancelled before it returned")


def test_generator_tools_are_refused() -> None:
    """A generator function returns an iterator, not its values: the model would read '<generator object ...>'."""

    def count(n: int) -> Any:
        """Count.

        Args:
            n: up to
        """
        yield from range(n)

    async def stream(n: int) -> Any:
        """Stream.

        Args:
            n: up to
        """
        for i in range(n):
            yield i

    with pytest.raises(ValueError, match=r"tool 'count' is a generator function: .*return a list"):
        Tool(count)
    with pytest.raises(ValueError, match=r"tool 'stream' is a generator function"):
        Tool(stream)
