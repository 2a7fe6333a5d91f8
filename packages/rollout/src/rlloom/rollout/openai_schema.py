"""The OpenAI-compatible request bodies the server accepts, and their translation to `SamplingParams`.

Field names follow OpenAI's API plus vLLM's extensions (`top_k`, `min_p`, `stop_token_ids`, `ignore_eos`,
`include_stop_str_in_output`), so the same client code talks to vLLM, SGLang and this server. Unknown fields
are rejected rather than silently ignored, and knobs we cannot honour (penalties, top logprobs) must be left
at their neutral values; the error names the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlloom.core_rl.generation import SamplingParams


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="Served model name (see /v1/models).")
    n: int = Field(default=1, ge=1, le=256)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1, description="vLLM extension; 0 or -1 disables.")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, description="vLLM extension.")
    max_tokens: int | None = Field(default=None, ge=1)
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
                raise ValueError(f"`{name}` is not supported by this server; leave it at 0")
        if self.stream:
            raise ValueError("`stream` is not supported by this server; send stream=false")
        return self

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


class ChatCompletionBody(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, le=0, description="Only 0/None: we return sampled tokens only.")
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _messages_have_roles(self) -> ChatCompletionBody:
        for i, m in enumerate(self.messages):
            if "role" not in m or "content" not in m:
                raise ValueError(f"messages[{i}] needs `role` and `content`")
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


class CompletionBody(_SamplingFields):
    """POST /v1/completions; `prompt` may be text, token ids, or a list of either (one choice set each)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=1, description="0 or 1: the sampled token's logprob.")
    echo: bool = False

    @model_validator(mode="after")
    def _no_echo(self) -> CompletionBody:
        if self.echo:
            raise ValueError("`echo` is not supported by this server; send echo=false")
        if isinstance(self.prompt, list) and len(self.prompt) == 0:
            raise ValueError("`prompt` is empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt in the body."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [[int(x) for x in p if isinstance(x, int)]]
        return list(p)  # type: ignore[arg-type]


class WeightsFromPath(BaseModel):
    """POST /v1/update_weights as JSON: a `.safetensors` file or a folder of them on the server's disk."""

    model_config = ConfigDict(extra="forbid")

    path: str
