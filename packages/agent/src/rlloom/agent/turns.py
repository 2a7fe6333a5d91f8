"""Chat-template turn boundaries as token ids, derived from the tokenizer's own template.

A multi-turn rollout must feed the model exactly what the chat template would render, yet never re-tokenise
the model's sampled turns. So the template is rendered once around placeholder texts and split at them: what
lies between the placeholders is template glue (e.g. `<|im_end|>\n<|im_start|>user\n`), tokenised and inserted
with loss_mask 0; observation contents are tokenised on their own (so they can be truncated); the model's
tokens are appended as sampled. Rendering a whole batch of new messages at once keeps templates that merge
consecutive tool results into one turn (Qwen2.5) correct.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlloom.agent.environment import Observation, Prompt
from rlloom.core_rl.contracts.generation import check_chat_template_kwargs

_SENTINEL = "\u2063RLLOOM{}\u2063"  # invisible separator: never produced by a template
_BASE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]

HERMES_TOOL_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
"""Qwen2.5's tool preamble, used when a tokenizer's chat template does not render `tools` itself."""


def with_tool_instructions(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose system message ends with the Hermes tool preamble (a system message is added if absent)."""
    text = HERMES_TOOL_INSTRUCTIONS.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0].get('content', '')}\n\n{text}"
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


@dataclass(slots=True)
class Segment:
    """A piece of context: template glue or observation content (only the latter may be truncated)."""

    ids: list[int]
    truncatable: bool
    cut: str = "end"  # where max_obs_tokens removes tokens: "end" (keep the head) or "middle" (head and tail)


class TurnTemplate:
    """Renders prompts and observations to token ids with the tokenizer's chat template."""

    def __init__(
        self,
        tokenizer: Any,
        eos_token_ids: Sequence[int] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        # extra template variables (Qwen3's enable_thinking) for every rendering: prompts and turn glue alike
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        check_chat_template_kwargs(self.chat_template_kwargs, "chat_template_kwargs")
        self.has_chat_template = getattr(tokenizer, "chat_template", None) is not None
        eos = set(eos_token_ids or ())
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.eos_token_ids = frozenset(eos)
        self._renders_tools: bool | None = None

    # -- text -> ids -----------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Tokenise once, without BOS/EOS: the ids go into the context exactly as returned."""
        if not text:
            return []
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The first context: chat messages rendered with a generation prompt, or raw text tokenised."""
        if prompt.text is not None:
            ids = self.encode(prompt.text)
        else:
            text = self.render_prompt_text(prompt)
            ids = self.encode(text)
        if not ids:
            raise ValueError("the environment's prompt rendered to zero tokens; give it a question or messages")
        return ids

    def render_prompt_text(self, prompt: Prompt) -> str:
        if prompt.text is not None:
            return prompt.text
        self._require_template("render chat messages")
        assert prompt.messages is not None
        messages = prompt.messages
        kwargs: dict[str, Any] = {**self.chat_template_kwargs, "tokenize": False, "add_generation_prompt": True}
        if prompt.tools:
            if self._renders_tools is None:
                self._renders_tools = self.template_renders_tools()
            if self._renders_tools:
                kwargs["tools"] = prompt.tools
            else:  # the template ignores `tools`: describe them the way Qwen2.5's template does
                messages = with_tool_instructions(messages, prompt.tools)
        return str(self.tokenizer.apply_chat_template(messages, **kwargs))

    def template_renders_tools(self) -> bool:
        """Whether the chat template shows `tools=` to the model (if not, envs describe tools themselves)."""
        if not self.has_chat_template:
            return False
        msgs = [{"role": "user", "content": "U"}]
        tool = {"type": "function", "function": {"name": "probe_tool_x", "description": "d", "parameters": {}}}
        with_tools = self.tokenizer.apply_chat_template(msgs, tools=[tool], tokenize=False, **self.chat_template_kwargs)
        return "probe_tool_x" in str(with_tools)

    # -- observations ----------------------------------------------------------------------------------------
    def observation_segments(self, obs: Observation, last_turn_ids: Sequence[int]) -> list[Segment]:
        """Token segments that follow a model turn: glue (mask 0) and contents (mask 0, truncatable)."""
        if obs.text is not None:
            return [
                Segment(self.encode(obs.before), False),
                Segment(self.encode(obs.text), True, obs.truncate),
                Segment(self.encode(obs.after), False),
            ]
        assert obs.messages is not None
        self._require_template("render observation messages")
        contents: list[str] = []
        placeholders = []
        for i, message in enumerate(obs.messages):
            placeholders.append({**message, "content": _SENTINEL.format(i)})
            contents.append(str(message.get("content", "")))
        pieces = self._render_between(placeholders)
        segments = [Segment(self.encode(self._without_sampled_eos(pieces[0], last_turn_ids)), False)]
        for content, glue in zip(contents, pieces[1:], strict=True):
            segments.append(Segment(self.encode(content), True, obs.truncate))
            segments.append(Segment(self.encode(glue), False))
        return segments

    def _without_sampled_eos(self, glue: str, last_turn_ids: Sequence[int]) -> str:
        """`glue` (which opens with the assistant turn's end) minus an EOS the model already sampled."""
        if last_turn_ids and last_turn_ids[-1] in self.eos_token_ids:
            sampled = self.tokenizer.decode([last_turn_ids[-1]], skip_special_tokens=False)
            if glue.startswith(sampled):
                return glue[len(sampled) :]
        return glue

    def _render_between(self, messages: list[dict[str, Any]]) -> list[str]:
        """Template text after an assistant turn's content, between the placeholder contents of `messages`, and
        after them (the first piece holds the assistant turn's end).

        Only what follows the assistant's content is read, so a template may render that earlier turn itself
        differently once messages follow (Qwen3 adds an empty `<think></think>` to a final assistant turn
        only): the model's own tokens for it are in the context already, as sampled.
        """
        marker = _SENTINEL.format("A")
        base = [*_BASE, {"role": "assistant", "content": marker}]
        try:
            full = str(
                self.tokenizer.apply_chat_template(
                    base + messages, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
                )
            )
        except Exception as exc:  # jinja's raise_exception: e.g. "roles must alternate user/assistant"
            roles = ", ".join(repr(m.get("role")) for m in messages)
            raise ValueError(
                f"the chat template cannot render observation messages with roles {roles} after an assistant turn "
                f"({type(exc).__name__}: {exc}); give the env a role the template accepts (ToolEnv(tool_role='user') "
                "for templates without a tool role)"
            ) from exc
        if full.count(marker) != 1:
            raise ValueError(
                "the chat template does not render an assistant turn's content once messages follow it, so turn "
                "glue cannot be inserted as tokens; use an environment that appends observations as text instead"
            )
        delta = full.split(marker, 1)[1]
        pieces = []
        for i in range(len(messages)):
            marker = _SENTINEL.format(i)
            if marker not in delta:
                raise ValueError(f"the chat template dropped the content of message {i} ({messages[i]['role']!r})")
            before, delta = delta.split(marker, 1)
            pieces.append(before)
        pieces.append(delta)
        return pieces

    def _require_template(self, what: str) -> None:
        if not self.has_chat_template:
            raise ValueError(f"cannot {what}: the tokenizer has no chat_template; set one or use text prompts")
