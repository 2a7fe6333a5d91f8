"""The OpenAI-compatible request bodies the server accepts, and their translation to `SamplingParams`.

Field names follow OpenAI's API plus vLLM's extensions (`top_k`, `min_p`, `stop_token_ids`, `ignore_eos`,
`include_stop_str_in_output`), so the same client code talks to vLLM, SGLang and this server. Unknown fields
are rejected rather than silently ignored, and knobs we cannot honour (penalties, top logprobs) must be left
at their neutral values. Validators raise `FieldError`, so the server's 400 names the field (`stream`,
`messages[2].content`), not the body.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlloom.core_rl.contracts.generation import RESERVED_TEMPLATE_ARGUMENTS, SamplingParams

CHAT_ROLES = ("system", "user", "assistant", "tool")
TOP_LOGPROBS_UNSUPPORTED = (
    "only the sampled token's logprob is returned (top_logprobs / logprobs > 1 are not supported)"
)


class FieldError(ValueError):
    """A request value the server refuses; `field` is the OpenAI error's `param`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"`{field}`: {message}")
        self.field = field


def _lone_surrogate(value: Any, path: str) -> tuple[str, int, str] | None:
    """(field path, character index, the surrogate) of the first string in `value` that is not valid Unicode.

    JSON's `\\ud800` escape decodes to a lone UTF-16 surrogate, which no tokenizer or UTF-8 encoder accepts: caught
    here, it is a 400 naming the field instead of an engine failure (500). Keys are checked too, since an unknown
    key is echoed in the error message.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return path, err.start, value[err.start]
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            found = _lone_surrogate(key, path or "body") or _lone_surrogate(item, where)
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, int) and (found := _lone_surrogate(item, f"{path}[{i}]")):
                return found
    return None


class _SamplingFields(BaseModel):
    # allow_inf_nan: JSON's Infinity/NaN would pass `ge=0` (temperature=Infinity sampled uniformly at random)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        found = _lone_surrogate(data, "")
        if found is not None:
            field, index, char = found
            raise FieldError(
                field,
                f"holds a lone UTF-16 surrogate ({char.encode('unicode_escape').decode()}) at character {index}, "
                "which is not text; escape characters outside the Basic Multilingual Plane as a surrogate pair or "
                "send them as UTF-8",
            )
        return data

    model: str = Field(description="Served model name (see /v1/models).")
    n: int = Field(default=1, ge=1, le=256)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1, description="vLLM extension; 0 or -1 disables.")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, description="vLLM extension.")
    max_tokens: int | None = Field(default=None, ge=1, description="Capped at the context the prompt leaves.")
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, description="vLLM extension.")
    ignore_eos: bool = Field(default=False, description="vLLM extension.")
    include_stop_str_in_output: bool = Field(default=False, description="vLLM extension (default as vLLM's).")
    seed: int | None = None
    return_token_ids: bool = Field(default=True, description="vLLM extension; token ids are always returned.")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @model_validator(mode="after")
    def _neutral_unsupported(self) -> _SamplingFields:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0.0:
                raise FieldError(name, "not supported by this server; leave it at 0")
        if self.stream:
            raise FieldError("stream", "streaming is not supported by this server; send stream=false")
        return self

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        # "" matches at once, so the sample would end after one token (vLLM refuses it too)
        if stop == "" or (isinstance(stop, list) and "" in stop):
            raise FieldError("stop", "empty stop strings are not allowed (they match at once); remove them")
        return stop

    def sampling(self, logprobs: bool, default_max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            min_p=self.min_p,
            max_tokens=self.max_tokens or default_max_tokens,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            include_stop_str_in_output=self.include_stop_str_in_output,
            ignore_eos=self.ignore_eos,
            seed=self.seed,
            logprobs=logprobs,
        )


def _content_text(field: str, content: Any) -> str:
    """A message's content as one string: text parts joined by newlines (as vLLM does for text-only models)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise FieldError(field, "give a string or a list of {'type': 'text', 'text': ...} parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image_url", "input_image", "image"):
            raise FieldError(field, f"part {j} is an image; images are not supported by this server (text only)")
        else:
            raise FieldError(field, f"part {j} is not a text part; send {{'type': 'text', 'text': ...}} parts only")
    return "\n".join(texts)


def chat_message(i: int, message: Any) -> dict[str, Any]:
    """`messages[i]` checked and with its content as a string, ready for the chat template."""
    if not isinstance(message, dict):
        raise FieldError(f"messages[{i}]", "give an object with `role` and `content`")
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise FieldError(f"messages[{i}].role", f"unknown role {role!r}; use one of {', '.join(CHAT_ROLES)}")
    if role == "assistant" and message.get("tool_calls") is not None:
        message = {**message, "tool_calls": _template_tool_calls(i, message["tool_calls"])}
    content = message.get("content")
    if content is None:
        # OpenAI lets an assistant turn that only calls tools leave its content out
        if role == "assistant" and message.get("tool_calls"):
            return {**message, "content": ""}
        raise FieldError(f"messages[{i}].content", "missing or null; give a string or a list of text parts")
    return {**message, "content": _content_text(f"messages[{i}].content", content)}


def _template_tool_calls(i: int, calls: Any) -> list[Any]:
    """An assistant turn's OpenAI `tool_calls` with each `function.arguments` JSON string parsed to an object.

    OpenAI sends arguments as a JSON string, but chat templates (Qwen's `arguments | tojson`) expect the object;
    a string would be rendered double-encoded, unlike anything the model was trained on. vLLM parses them too.
    """
    if not isinstance(calls, list):
        raise FieldError(f"messages[{i}].tool_calls", "give a list of {'type': 'function', 'function': ...} calls")
    out: list[Any] = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise FieldError(
                f"messages[{i}].tool_calls[{j}]", "give {'type': 'function', 'function': {'name', 'arguments'}}"
            )
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            where = f"messages[{i}].tool_calls[{j}].function.arguments"
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                raise FieldError(where, f"is not valid JSON ({exc.msg}); send a JSON-encoded object") from None
        out.append({**call, "function": {**function, "arguments": arguments}})
    return out


class ChatCompletionBody(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra chat-template variables (vLLM's field), e.g. enable_thinking."
    )
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, description="Only 0/None: we return sampled tokens only.")
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _messages_as_text(self) -> ChatCompletionBody:
        self.messages = [chat_message(i, m) for i, m in enumerate(self.messages)]
        clash = sorted(RESERVED_TEMPLATE_ARGUMENTS & set(self.chat_template_kwargs))
        if clash:
            raise FieldError("chat_template_kwargs", f"{', '.join(clash)} cannot be set there (the server sets them)")
        if self.top_logprobs:
            raise FieldError("top_logprobs", f"{TOP_LOGPROBS_UNSUPPORTED}; send 0 or leave it out")
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


class CompletionBody(_SamplingFields):
    """POST /v1/completions; `prompt` may be text, token ids, or a list of either (one choice set each)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, description="0 or 1: the sampled token's logprob.")
    echo: bool = False

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, prompt: Any) -> Any:
        # checked by hand: the union's own error lists every member it tried
        if isinstance(prompt, list) and not prompt:
            raise FieldError("prompt", "is empty; give text or token ids")
        ok = isinstance(prompt, str) or _is_ids(prompt)
        if isinstance(prompt, list):
            ok = ok or all(isinstance(p, str) for p in prompt) or all(_is_ids(p) for p in prompt)
        if not ok:
            raise FieldError("prompt", "give a string, a list of token ids, or a list of strings or of id lists")
        return prompt

    @model_validator(mode="after")
    def _no_echo(self) -> CompletionBody:
        if self.echo:
            raise FieldError("echo", "not supported by this server; send echo=false")
        if self.logprobs is not None and self.logprobs > 1:
            raise FieldError("logprobs", f"{TOP_LOGPROBS_UNSUPPORTED}; send 0 or 1")
        return self

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt in the body."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [[int(x) for x in p if isinstance(x, int)]]
        return list(p)  # type: ignore[arg-type]


class ServerLimits(BaseModel):
    """What one request may ask of the server, so no single client can exhaust it."""

    model_config = ConfigDict(extra="forbid")

    max_prompts: int = Field(
        default=1024, ge=1, description="Prompts in one /v1/completions body; more is a 400 naming `prompt`."
    )
    max_update_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Largest /v1/update_weights body (413 beyond it, never buffered whole). Default: twice the "
        "served model's weights in bytes (fp32 weights for a bf16 model) plus 64 MiB, or 64 GiB when the engine "
        "does not expose its model.",
    )


class WeightsFromPath(BaseModel):
    """POST /v1/update_weights as JSON: a `.safetensors` file or a folder of them on the server's disk."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="A .safetensors file, or a folder of them, on the server's disk.")
