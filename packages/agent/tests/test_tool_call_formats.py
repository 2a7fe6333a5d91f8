"""Llama 3 JSON, Mistral and Qwen3-Coder tool-call parsers against hand-written model turns, and one of each
through ToolEnv + AgentLoop."""

from __future__ import annotations

from typing import Any

import pytest

from rlloom.agent.envs.tool import ToolEnv
from rlloom.agent.loop import AgentLoop
from rlloom.agent.rewards import AgentRubric
from rlloom.agent.tool_calls import (
    TOOL_CALL_PARSERS,
    HermesToolCallParser,
    Llama3JsonToolCallParser,
    MistralToolCallParser,
    ParsedToolCalls,
    Qwen3CoderToolCallParser,
    ToolCall,
    make_tool_call_parser,
)
from rlloom.agent.tools import Toolset


def calls(parsed: ParsedToolCalls) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in parsed.calls]


def blocks(parsed: ParsedToolCalls) -> list[Any]:
    """Each block as (name, arguments) or its error text, in order."""
    return [(b.name, b.arguments) if isinstance(b, ToolCall) else b for b in parsed.blocks]


# -- Llama 3.1/3.2/3.3 (vLLM llama3_json) --------------------------------------------------------------------------


def test_llama3_single_call_with_and_without_python_tag() -> None:
    parser = Llama3JsonToolCallParser()
    plain = parser.parse('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}')
    assert calls(plain) == [("get_weather", {"city": "Paris", "days": 2})]
    assert plain.calls[0].raw == '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}'
    tagged = parser.parse('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}')
    assert calls(tagged) == [("get_weather", {"city": "Oslo"})]
    assert not tagged.errors


def test_llama3_calls_separated_by_semicolons_and_text_around() -> None:
    text = (
        "I will look both up.\n"
        '{"name": "lookup", "parameters": {"key": "a", "opts": {"deep": true}}}; '
        '{"name": "lookup", "arguments": {"key": "b"}};{"name": "now", "parameters": {}}\n'
        "Then I answer."
    )
    parsed = Llama3JsonToolCallParser().parse(text)
    assert calls(parsed) == [
        ("lookup", {"key": "a", "opts": {"deep": True}}),
        ("lookup", {"key": "b"}),
        ("now", {}),
    ]
    assert not parsed.errors


def test_llama3_braces_in_prose_are_not_calls() -> None:
    parser = Llama3JsonToolCallParser()
    assert not parser.parse("The answer is $\\frac{1}{2}$, i.e. \\boxed{0.5}.").found_any
    assert not parser.parse('A set {1, 2} and a dict {"key": 1} are not calls.').found_any
    assert not parser.parse("just text").found_any


def test_llama3_malformed_calls_are_errors() -> None:
    parser = Llama3JsonToolCallParser()
    cut = parser.parse('{"name": "f", "parameters": {"x": 1')
    assert blocks(cut) == [
        'tool call is not valid JSON (Expecting \',\' delimiter at position 35): {"name": "f", "parameters": {"x": 1'
    ]
    # a good call, then a broken one: the broken one is reported and nothing after it is read
    parsed = parser.parse(
        '{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {x: 2}}; {"name": "h", "parameters": {}}'
    )
    assert blocks(parsed) == [
        ("f", {"x": 1}),
        "tool call is not valid JSON (Expecting property name enclosed in double quotes at position 29): "
        '{"name": "g", "parameters": {x: 2}}; {"name": "h", "parameters": {}}',
    ]
    assert blocks(parser.parse('{"name": "", "parameters": {}}')) == ['tool call has no "name" string']
    assert blocks(parser.parse('{"name": "f", "parameters": [1, 2]}')) == [
        "tool call 'f': \"arguments\" must be a JSON object"
    ]
    assert blocks(parser.parse("<|python_tag|>brave_search.call(query='x')")) == [
        '<|python_tag|> must be followed by a JSON object like {"name": ..., "parameters": {...}}'
    ]
    assert blocks(parser.parse("<|python_tag|>[1, 2]")) == [
        '<|python_tag|> must be followed by a JSON object like {"name": ..., "parameters": {...}}'
    ]
    assert blocks(parser.parse('<|python_tag|>{"parameters": {}}')) == ['tool call has no "name" string']


# -- Mistral (vLLM mistral; mistral-common's tokenizer forms) --------------------------------------------------------


def test_mistral_json_list_form_single_and_multiple() -> None:
    parser = MistralToolCallParser()
    one = parser.parse('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]')
    assert calls(one) == [("get_weather", {"city": "Paris"})]
    two = parser.parse(
        'Let me check.[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "abcDEF123"}, '
        '{"name": "now", "arguments": {}}]'
    )
    assert calls(two) == [("add", {"a": 1, "b": 2}), ("now", {})]
    assert not two.errors


def test_mistral_name_args_form_single_multiple_and_call_id() -> None:
    parser = MistralToolCallParser()
    one = parser.parse('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "units": ["c"]}')
    assert calls(one) == [("get_weather", {"city": "Paris", "units": ["c"]})]
    assert one.calls[0].raw == 'get_weather[ARGS]{"city": "Paris", "units": ["c"]}'
    many = parser.parse(
        'Sure. [TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]lookup[CALL_ID]abcDEF123[ARGS]{"key": "x"}'
        '[TOOL_CALLS]now{"tz": "UTC"}'
    )
    assert calls(many) == [("add", {"a": 1, "b": 2}), ("lookup", {"key": "x"}), ("now", {"tz": "UTC"})]
    assert not many.errors
    assert not parser.parse('No marker: get_weather[ARGS]{"city": "Paris"}').found_any


def test_mistral_malformed_calls_are_errors() -> None:
    parser = MistralToolCallParser()
    form = '[TOOL_CALLS]NAME[ARGS]{...JSON arguments...} or [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]'
    parsed = parser.parse(
        '[TOOL_CALLS]add[ARGS]{"a": 1,}'  # bad JSON
        "[TOOL_CALLS]I think I should add"  # no arguments
        '[TOOL_CALLS][ARGS]{"a": 1}'  # no name
        '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}'  # fine
        "[TOOL_CALLS]"  # nothing after the marker
    )
    assert blocks(parsed) == [
        "tool call 'add': the arguments object is not valid JSON "
        '(Expecting property name enclosed in double quotes at position 8): {"a": 1,}',
        f"a call after [TOOL_CALLS] must be {form}",
        f"a call after [TOOL_CALLS] must be {form}",
        ("add", {"a": 1, "b": 2}),
        f"[TOOL_CALLS] is not followed by a tool call; write {form}",
    ]
    assert blocks(parser.parse('[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}')) == [
        "tool call list after [TOOL_CALLS] is not valid JSON (Expecting ',' delimiter at position 36): "
        '[{"name": "f", "arguments": {"x": 1}'
    ]
    assert blocks(parser.parse('[TOOL_CALLS][{"arguments": {}}, 3, {"name": "f", "arguments": "{\\"x\\": 1}"}]')) == [
        'tool call has no "name" string',
        'tool call must be a JSON object like {"name": ..., "arguments": {...}}',
        ("f", {"x": 1}),
    ]
    assert blocks(parser.parse("[TOOL_CALLS][]")) == [f"[TOOL_CALLS] is followed by an empty list; write {form}"]
    assert blocks(parser.parse('[TOOL_CALLS]a[ARGS]{"x": 1}b[ARGS]{"y": 2}')) == [
        "tool call 'a': each call needs its own [TOOL_CALLS] marker"
    ]


# -- Qwen3-Coder XML (vLLM qwen3_coder) -----------------------------------------------------------------------------


def search(query: str, *, limit: int, exact: bool, tags: list[str], score: float, since: int | None = None) -> str:
    """Search.

    Args:
        query: what to find
        limit: how many results
        exact: exact match only
        tags: tags to filter by
        score: minimum score
        since: year
    """
    return query


QWEN3_CODER_TOOLS = Toolset([search]).schemas


def test_qwen3_coder_converts_values_by_the_tool_schema() -> None:
    text = (
        "I'll search for it.\n"
        "<tool_call>\n<function=search>\n"
        "<parameter=query>\n  two\nlines \n</parameter>\n"
        "<parameter=limit>\n3\n</parameter>\n"
        "<parameter=exact>\nTrue\n</parameter>\n"
        '<parameter=tags>\n["a", "b"]\n</parameter>\n'
        "<parameter=score>\n0.5\n</parameter>\n"
        "<parameter=since>\nnull\n</parameter>\n"
        "</function>\n</tool_call>\nDone."
    )
    parsed = Qwen3CoderToolCallParser(QWEN3_CODER_TOOLS).parse(text)
    assert calls(parsed) == [
        (
            "search",
            {"query": "  two\nlines ", "limit": 3, "exact": True, "tags": ["a", "b"], "score": 0.5, "since": None},
        )
    ]
    assert parsed.calls[0].raw.startswith("<function=search>\n<parameter=query>")
    # without schemas (or for a parameter or tool the schemas do not name) every value is text
    untyped = Qwen3CoderToolCallParser().parse(text)
    assert untyped.calls[0].arguments["limit"] == "3" and untyped.calls[0].arguments["since"] == "null"


def test_qwen3_coder_multiple_calls_and_values_that_do_not_convert() -> None:
    text = (
        "<tool_call>\n<function=search>\n<parameter=query>\nnull\n</parameter>\n"
        "<parameter=limit>\nmany\n</parameter>\n<parameter=exact>\nyes\n</parameter>\n"
        "<parameter=tags>\n['x', 'y']\n</parameter>\n<parameter=score>\n2\n</parameter>\n"
        "<parameter=extra>\n7\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=other>\n<parameter=n>\n1\n</parameter>\n</function>\n</tool_call>"
        "<tool_call><function=now></function></tool_call>"
    )
    parsed = Qwen3CoderToolCallParser(QWEN3_CODER_TOOLS).parse(text)
    assert calls(parsed) == [
        # a string stays text even if it reads "null"; "many"/"yes" stay text for the argument check to refuse;
        # a Python list literal is read; an unknown parameter stays text
        ("search", {"query": "null", "limit": "many", "exact": "yes", "tags": ["x", "y"], "score": 2, "extra": "7"}),
        ("other", {"n": "1"}),
        ("now", {}),
    ]


def test_qwen3_coder_malformed_calls_are_errors() -> None:
    parser = make_tool_call_parser("qwen3_coder", QWEN3_CODER_TOOLS)
    parsed = parser.parse(
        "<tool_call>\n<function=search>\n<parameter=query>\nx\n</function>\n</tool_call>"
        "<tool_call>\n<function=search>\n<parameter=limit>\n1\n</parameter>\n</tool_call>"
        "<tool_call>\nsearch(query='x')\n</tool_call>"
        "<tool_call>\n<function=>\n</function>\n</tool_call>"
        "<tool_call>\n<function=search>\n<parameter=limit>\n1\n</parameter>\n<parameter=limit>\n2\n</parameter>\n"
        "</function>\n</tool_call>"
        "<tool_call>\n<function=search>\n<parameter=query>\nok\n</parameter>\n</function>\n</tool_call>"
        "<tool_call>\n<function=search>\n<parameter=query>\ncut"
    )
    assert blocks(parsed) == [
        "tool call 'search': a <parameter=...> block was not closed with </parameter>",
        "a <function=...> block was not closed with </function>",
        "a <tool_call> block must hold <function=NAME><parameter=ARG>value</parameter>...</function>",
        "tool call has no function name in <function=NAME>",
        "tool call 'search': parameter 'limit' is given twice",
        ("search", {"query": "ok"}),
        "a <tool_call> block was not closed with </tool_call>",
    ]
    bare = parser.parse("<function=search>\n<parameter=query>\nx\n</parameter>\n</function>")
    assert blocks(bare) == ["a <function=...> call must be inside <tool_call> ... </tool_call>"]
    assert not parser.parse("No tool needed: the answer is 4.").found_any


# -- selection by name -------------------------------------------------------------------------------------------------


def test_parsers_are_selected_by_vllm_name() -> None:
    assert sorted(TOOL_CALL_PARSERS) == ["hermes", "llama3_json", "mistral", "qwen3_coder"]
    assert isinstance(make_tool_call_parser("hermes"), HermesToolCallParser)
    assert isinstance(make_tool_call_parser("llama3_json"), Llama3JsonToolCallParser)
    assert isinstance(make_tool_call_parser("mistral"), MistralToolCallParser)
    with pytest.raises(ValueError, match=r"unknown tool-call parser 'qwen'; valid names: hermes, llama3_json, "):
        make_tool_call_parser("qwen")
    rubric = AgentRubric(lambda response, gold, extra_info=None: 0.0)
    env = ToolEnv(Toolset([search]), rubric, parser="qwen3_coder")
    assert isinstance(env.parser, Qwen3CoderToolCallParser) and "limit" in env.parser.properties["search"]
    with pytest.raises(ValueError, match=r"unknown tool-call parser 'llama'; valid names: hermes, llama3_json"):
        ToolEnv(Toolset([search]), rubric, parser="llama")


# -- end to end ------------------------------------------------------------------------------------------------------


def answer_is(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
    return float(response.strip() == f"<answer>{ground_truth}</answer>")


E2E_TURNS = {
    "qwen3_coder": [
        "Adding.\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n"
        "</function>\n</tool_call>",
        "<tool_call>\n<function=add>\n<parameter=a>\n1\n</function>\n</tool_call>",
    ],
    "llama3_json": [
        'Adding.\n<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}',
        '{"name": "add", "parameters": {"a": 1',
    ],
    "mistral": ['Adding.[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}', "[TOOL_CALLS]add[ARGS]"],
}
E2E_PARSE_ERRORS = {
    "qwen3_coder": "Error: tool call 'add': a <parameter=...> block was not closed with </parameter>",
    "llama3_json": "Error: tool call is not valid JSON (Expecting ',' delimiter at position 37): "
    '{"name": "add", "parameters": {"a": 1',
    "mistral": "Error: a call after [TOOL_CALLS] must be [TOOL_CALLS]NAME[ARGS]{...JSON arguments...} or "
    '[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]',
}


@pytest.mark.parametrize("parser", ["qwen3_coder", "llama3_json", "mistral"])
def test_tool_env_runs_calls_in_the_selected_format(tokenizer: Any, replay_engine: Any, parser: str) -> None:
    """The tool is called with the arguments written in the model's format (Qwen3-Coder's text "2" arrives as an
    int), its result comes back as a tool message, and a malformed call comes back as its parse error."""
    seen: list[tuple[Any, Any]] = []

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first addend
            b: second addend
        """
        seen.append((a, b))
        return a + b

    turns = [*E2E_TURNS[parser], "<answer>5</answer>"]
    engine = replay_engine(tokenizer, lambda context: turns[context.count("<|im_start|>assistant") - 1])
    toolset = Toolset([add])
    loop = AgentLoop(engine, tokenizer, lambda: ToolEnv(toolset, AgentRubric(answer_is), parser=parser))
    [traj] = loop.run([{"question": "What is 2+3?", "answer": "5"}])

    assert seen == [(2, 3)]
    results = [chunk.split("<|im_end|>")[0] for chunk in traj.response_text.split("<|im_start|>tool\n")[1:]]
    assert results == ["5", E2E_PARSE_ERRORS[parser]]
    sampled = tokenizer.decode([t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m], False)
    assert sampled == "".join(t + "<|im_end|>" for t in turns)  # text around the calls stays as sampled
    assert traj.finish_reason == "stop" and traj.reward == 1.0
    assert (traj.metrics["turns"], traj.metrics["tool_calls"], traj.metrics["tool_errors"]) == (3, 2, 1)
    assert traj.reward_components["format"] == pytest.approx(2 / 3)  # the malformed turn is not well formed
