"""Finding tool calls in a model's turn, in the model's own native format.

Qwen2.5/Qwen3 and Hermes models write `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; that is
`HermesToolCallParser`. Other formats plug in through the `ToolCallParser` protocol (one `parse` method).
A malformed call is not an exception: it comes back as an error message in its place among
`ParsedToolCalls.blocks` so the environment can tell the model what was wrong (in call order: Hermes tool
results carry no call id, so the model matches results to calls by position), which is how it learns the format.
"""

from __future__ import annotations

import json
import re
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
        if not isinstance(payload, dict):
            return None, 'tool call must be a JSON object like {"name": ..., "arguments": {...}}'
        name = payload.get("name")
        if not isinstance(name, str) or not name:
            return None, 'tool call has no "name" string'
        args: Any = payload.get("arguments", payload.get("parameters", {}))
        if args is None:  # `"arguments": null` for a tool without parameters, as some models write it
            args = {}
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                return None, f'tool call {name!r}: "arguments" is a string that is not JSON'
        if not isinstance(args, dict):
            return None, f'tool call {name!r}: "arguments" must be a JSON object'
        return ToolCall(name=name, arguments=args, raw=body), ""
