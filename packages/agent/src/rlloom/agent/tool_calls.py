"""Finding tool calls in a model's turn, in the model's own native format.

Qwen2.5/Qwen3 and Hermes models write `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; that is
`HermesToolCallParser`. Llama 3.1-3.3 (`Llama3JsonToolCallParser`), Mistral (`MistralToolCallParser`) and
Qwen3-Coder (`Qwen3CoderToolCallParser`) formats are here too, each under vLLM's `--tool-call-parser` name in
`TOOL_CALL_PARSERS` (`make_tool_call_parser(name, tools)`); other formats plug in through the `ToolCallParser`
protocol (one `parse` method). A malformed call is not an exception: it comes back as an error message in its
place among `ParsedToolCalls.blocks` so the environment can tell the model what was wrong (in call order: these
tool results carry no call id, so the model matches results to calls by position), which is how it learns the
format. Text around the calls is not the parser's business: the turn stays in the trajectory as sampled.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(slots=True)
class ToolCall:
    """A call the model asked for: tool name and JSON arguments."""

    name: str
    arguments: dict[str, Any]
    raw: str = ""


@dataclass(slots=True)
class ParsedToolCalls:
    """A turn's tool-call blocks in the order written: a `ToolCall`, or the error message for a malformed one."""

    blocks: list[ToolCall | str] = field(default_factory=list)

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        """The well-formed calls, in order (a tuple: add blocks to `blocks`, not here)."""
        return tuple(b for b in self.blocks if isinstance(b, ToolCall))

    @property
    def errors(self) -> tuple[str, ...]:
        """The malformed blocks' messages, in order (a tuple: add blocks to `blocks`, not here)."""
        return tuple(b for b in self.blocks if isinstance(b, str))

    @property
    def found_any(self) -> bool:
        return bool(self.blocks)


@runtime_checkable
class ToolCallParser(Protocol):
    """Turns one model turn's text into tool calls."""

    def parse(self, text: str) -> ParsedToolCalls: ...


class HermesToolCallParser:
    """`<tool_call>{"name": "f", "arguments": {...}}</tool_call>` blocks (Qwen2.5, Qwen3, Hermes).

    `arguments` may also be a JSON-encoded string (some models double-encode); anything else is an error.
    An opened but unclosed block (the turn was cut) is reported as an error too.
    """

    def __init__(self, open_tag: str = "<tool_call>", close_tag: str = "</tool_call>") -> None:
        self.open_tag, self.close_tag = open_tag, close_tag
        self._block = re.compile(re.escape(open_tag) + r"(.*?)" + re.escape(close_tag), re.DOTALL)

    def parse(self, text: str) -> ParsedToolCalls:
        parsed = ParsedToolCalls()
        for m in self._block.finditer(text):
            call, error = self._parse_one(m.group(1).strip())
            parsed.blocks.append(call if call is not None else error)
        if text.count(self.open_tag) > text.count(self.close_tag):
            parsed.blocks.append(f"a {self.open_tag} block was not closed with {self.close_tag}")
        return parsed

    def _parse_one(self, body: str) -> tuple[ToolCall | None, str]:
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            return None, f"tool call is not valid JSON ({exc.msg} at position {exc.pos}): {body[:200]}"
        block = _call_from_payload(payload, body)
        return (block, "") if isinstance(block, ToolCall) else (None, block)


_HERMES_SHAPE = '{"name": ..., "arguments": {...}}'


def _call_from_payload(payload: Any, raw: str, shape: str = _HERMES_SHAPE) -> ToolCall | str:
    """A decoded `{"name": ..., "arguments"|"parameters": {...}}` object as a call, or the error for the model.

    `arguments` may be absent or null (no arguments) or a JSON-encoded string (some models double-encode)."""
    if not isinstance(payload, dict):
        return f"tool call must be a JSON object like {shape}"
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return 'tool call has no "name" string'
    args: Any = payload.get("arguments", payload.get("parameters", {}))
    if args is None:  # `"arguments": null` for a tool without parameters, as some models write it
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return f'tool call {name!r}: "arguments" is a string that is not JSON'
    if not isinstance(args, dict):
        return f'tool call {name!r}: "arguments" must be a JSON object'
    return ToolCall(name=name, arguments=args, raw=raw)


_DECODER = json.JSONDecoder()


def _json_error(what: str, exc: json.JSONDecodeError, text: str, start: int) -> str:
    """The message for JSON that does not decode, with the position counted from where it starts."""
    return f"{what} is not valid JSON ({exc.msg} at position {exc.pos - start}): {text[start : start + 200]}"


class Llama3JsonToolCallParser:
    """Llama 3.1/3.2/3.3 JSON tool calls (vLLM's `llama3_json`): `{"name": "f", "parameters": {...}}`.

    The call is a bare JSON object, optionally after `<|python_tag|>`; several calls in one turn are separated
    by `;`. `"arguments"` is read as well as `"parameters"`. With no tags around the JSON, a call is recognised by
    its start, `{"name":` (or anything after `<|python_tag|>`), so a brace in prose or maths (`\\frac{1}{2}`) is
    not a call; a final answer that is itself a JSON object with a `"name"` key reads as a call, as in vLLM.
    A call whose JSON does not decode (malformed, or the turn was cut) is an error, and the rest of the turn is
    not searched further: where the broken object ends cannot be known.
    """

    python_tag = "<|python_tag|>"
    _start = re.compile(re.escape(python_tag) + r'|\{\s*"name"\s*:')
    _shape = '{"name": ..., "parameters": {...}}'

    def parse(self, text: str) -> ParsedToolCalls:
        parsed = ParsedToolCalls()
        pos = 0
        while (m := self._start.search(text, pos)) is not None:
            start = m.start()
            if m.group() == self.python_tag:
                start = m.end() + len(text[m.end() :]) - len(text[m.end() :].lstrip())
                if not text.startswith("{", start):
                    parsed.blocks.append(f"{self.python_tag} must be followed by a JSON object like {self._shape}")
                    pos = m.end()
                    continue
            try:
                payload, end = _DECODER.raw_decode(text, start)
            except json.JSONDecodeError as exc:
                parsed.blocks.append(_json_error("tool call", exc, text, start))
                break
            parsed.blocks.append(_call_from_payload(payload, text[start:end], self._shape))
            pos = end
        return parsed


class MistralToolCallParser:
    """Mistral tool calls (vLLM's `mistral`), every form mistral-common decodes, after a `[TOOL_CALLS]` marker:

    - tokenizer v2-v7 (Mistral 7B v0.3, Nemo, Small 2409...): `[TOOL_CALLS][{"name": "f", "arguments": {...}},
      ...]`, one JSON list for all the turn's calls (an `"id"` key is allowed and ignored);
    - tokenizer v11+ (Mistral Small 3.x, Magistral, Devstral...): `[TOOL_CALLS]f[ARGS]{...}`, one marker per call,
      optionally `f[CALL_ID]abc123XYZ[ARGS]{...}`; `f{...}` (no `[ARGS]`, as vLLM also reads) is accepted too.

    Text before the first `[TOOL_CALLS]` is the turn's content; a turn without the marker has no calls.
    `[TOOL_CALLS]` is a special token in Mistral tokenizers: the engine must keep special tokens in the text it
    returns (`HFEngineConfig(skip_special_tokens=False)`), or this parser never sees the marker.
    """

    marker = "[TOOL_CALLS]"
    _shape = '{"name": ..., "arguments": {...}}'
    _form = f"{marker}NAME[ARGS]{{...JSON arguments...}} or {marker}[{_shape}, ...]"
    _name = re.compile(r"[^\s\[\]{}]+")

    def parse(self, text: str) -> ParsedToolCalls:
        parsed = ParsedToolCalls()
        for piece in text.split(self.marker)[1:]:
            body = piece.strip()
            if not body:
                parsed.blocks.append(f"{self.marker} is not followed by a tool call; write {self._form}")
            elif body.startswith("[") and not body.startswith(("[ARGS]", "[CALL_ID]")):
                parsed.blocks.extend(self._parse_list(body))
            else:
                parsed.blocks.append(self._parse_named(body))
        return parsed

    def _parse_list(self, body: str) -> list[ToolCall | str]:
        try:
            payload, _ = _DECODER.raw_decode(body)
        except json.JSONDecodeError as exc:
            return [_json_error(f"tool call list after {self.marker}", exc, body, 0)]
        if not payload:
            return [f"{self.marker} is followed by an empty list; write {self._form}"]
        return [_call_from_payload(item, json.dumps(item, ensure_ascii=False), self._shape) for item in payload]

    def _parse_named(self, body: str) -> ToolCall | str:
        if "[ARGS]" in body:
            head, args_text = body.split("[ARGS]", 1)
        elif "{" in body:
            head, args_text = body[: body.index("{")], body[body.index("{") :]
        else:
            return f"a call after {self.marker} must be {self._form}"
        name = head.split("[CALL_ID]", 1)[0].strip()
        args_text = args_text.lstrip()
        if not self._name.fullmatch(name) or not args_text.startswith("{"):
            return f"a call after {self.marker} must be {self._form}"
        try:
            args, end = _DECODER.raw_decode(args_text)
        except json.JSONDecodeError as exc:
            return _json_error(f"tool call {name!r}: the arguments object", exc, args_text, 0)
        if "[ARGS]" in args_text[end:]:
            return f"tool call {name!r}: each call needs its own {self.marker} marker"
        return _call_from_payload({"name": name, "arguments": args}, body[: len(body) - len(args_text) + end])


ToolSchemas = Sequence[dict[str, Any]]
"""OpenAI-style tool schemas (`Toolset.schemas`): `{"type": "function", "function": {"name", "parameters"}}`."""


class Qwen3CoderToolCallParser:
    """Qwen3-Coder XML tool calls (vLLM's `qwen3_coder`), as its chat template writes them::

        <tool_call>
        <function=NAME>
        <parameter=ARG>
        value
        </parameter>
        </function>
        </tool_call>

    One newline right after `<parameter=ARG>` and one right before `</parameter>` belong to the format, not the
    value. Values are text; they become JSON values by the parameter's type in the tool's JSON schema (`tools`,
    `Toolset.schemas`; `ToolEnv(parser="qwen3_coder")` passes them): string parameters, parameters the schema does
    not name and tools it does not know keep the text verbatim; otherwise `null` is None, integers and numbers
    are parsed, `true`/`false` (any case) are booleans, and objects and arrays are read as JSON (Python literals
    as a fallback, as vLLM does). A value that does not convert stays text, so the tool's argument check names
    the problem. Unclosed `<tool_call>`, `<function=...>` or `<parameter=...>` blocks, a `<function=...>` outside
    `<tool_call>`, a block without a function, and a parameter given twice are errors.
    """

    _block = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    _function = re.compile(r"<function=([^>]*)>(.*?)</function>", re.DOTALL)
    _parameter = re.compile(r"<parameter=([^>]*)>(.*?)</parameter>", re.DOTALL)
    _shape = "<function=NAME><parameter=ARG>value</parameter>...</function>"

    def __init__(self, tools: ToolSchemas | None = None) -> None:
        self.properties: dict[str, dict[str, Any]] = {}
        for schema in tools or ():
            fn = schema.get("function", schema)
            params = fn.get("parameters") or {}
            if isinstance(fn.get("name"), str) and isinstance(params, dict):
                self.properties[fn["name"]] = dict(params.get("properties") or {})

    def parse(self, text: str) -> ParsedToolCalls:
        parsed = ParsedToolCalls()
        for m in self._block.finditer(text):
            parsed.blocks.extend(self._parse_block(m.group(1)))
        if text.count("<tool_call>") > text.count("</tool_call>"):
            parsed.blocks.append("a <tool_call> block was not closed with </tool_call>")
        elif "<function=" in self._block.sub("", text):
            parsed.blocks.append("a <function=...> call must be inside <tool_call> ... </tool_call>")
        return parsed

    def _parse_block(self, body: str) -> list[ToolCall | str]:
        blocks: list[ToolCall | str] = [self._parse_function(m) for m in self._function.finditer(body)]
        if body.count("<function=") > len(blocks):
            blocks.append("a <function=...> block was not closed with </function>")
        if not blocks:
            blocks.append(f"a <tool_call> block must hold {self._shape}")
        return blocks

    def _parse_function(self, m: re.Match[str]) -> ToolCall | str:
        name, inner = m.group(1).strip(), m.group(2)
        if not name:
            return "tool call has no function name in <function=NAME>"
        params = list(self._parameter.finditer(inner))
        if inner.count("<parameter=") > len(params):
            return f"tool call {name!r}: a <parameter=...> block was not closed with </parameter>"
        schema = self.properties.get(name, {})
        arguments: dict[str, Any] = {}
        for p in params:
            key = p.group(1).strip()
            if not key:
                return f"tool call {name!r}: a parameter has no name in <parameter=ARG>"
            if key in arguments:
                return f"tool call {name!r}: parameter {key!r} is given twice"
            value = p.group(2)
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            arguments[key] = _from_text(value, schema.get(key))
        return ToolCall(name=name, arguments=arguments, raw=m.group(0))


def _schema_types(schema: Any) -> set[str]:
    """The JSON types a schema admits (`type` as a string or list, `anyOf`/`oneOf`, `nullable`)."""
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    types = {t for t in kinds if isinstance(t, str)}
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            types |= _schema_types(option)
    if schema.get("nullable"):
        types.add("null")
    return types


def _from_text(value: str, schema: Any) -> Any:
    """A Qwen3-Coder parameter's text as the JSON value its schema asks for; the text itself when it is a string
    (or unknown), or does not convert."""
    types = _schema_types(schema)
    if not types or "string" in types:
        return value
    text = value.strip()
    if text.lower() == "null":
        return None
    if types & {"integer", "number"}:
        for convert in (int, float) if "number" in types else (int,):
            try:
                return convert(text)
            except ValueError:
                pass
    if "boolean" in types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if types - {"integer", "number", "boolean", "null"}:  # object, array, or a type we do not know
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
        try:
            return ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
    return value


TOOL_CALL_PARSERS: dict[str, Callable[[ToolSchemas], ToolCallParser]] = {
    "hermes": lambda tools: HermesToolCallParser(),
    "llama3_json": lambda tools: Llama3JsonToolCallParser(),
    "mistral": lambda tools: MistralToolCallParser(),
    "qwen3_coder": Qwen3CoderToolCallParser,
}
"""Tool-call parsers by vLLM's `--tool-call-parser` name; each factory gets the tools' JSON schemas."""


def make_tool_call_parser(name: str, tools: ToolSchemas = ()) -> ToolCallParser:
    """The parser registered as `name` in `TOOL_CALL_PARSERS`, for these tools (Qwen3-Coder types values by them)."""
    factory = TOOL_CALL_PARSERS.get(name)
    if factory is None:
        raise ValueError(f"unknown tool-call parser {name!r}; valid names: {', '.join(sorted(TOOL_CALL_PARSERS))}")
    return factory(tools)
