"""What a rollout engine is asked for and what it gives back.

These types live in core-rl because every engine (HF, vLLM, an OpenAI-compatible server) and every caller
(the trainer, the agent loop, eval scripts) must agree on them; `rlloom.rollout` implements engines against
them. Token ids are the source of truth: text is derived from them, never the other way round, so the tokens
trained on are exactly the tokens sampled.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FinishReason = Literal["stop", "length", "abort"]


class SamplingParams(BaseModel):
    """How to sample; field names follow vLLM's `SamplingParams` so configs carry over."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(default=1, ge=1, description="Samples per prompt (the GRPO group size).")
    temperature: float = Field(default=1.0, ge=0.0, description="0 means greedy decoding.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1.0 disables it.")
    top_k: int = Field(default=0, ge=0, description="Keep the k most likely tokens; 0 disables it.")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, description="Drop tokens below min_p x the top probability.")
    max_tokens: int = Field(default=256, ge=1, description="New tokens per sample at most (finish reason 'length').")
    stop: list[str] = Field(default_factory=list, description="Stop strings; generation ends right after one.")
    stop_token_ids: list[int] = Field(
        default_factory=list, description="Extra stop token ids besides the tokenizer's EOS."
    )
    include_stop_str_in_output: bool = Field(
        default=True,
        description="Keep the matched stop string in the text (agents need `</search>` in the action).",
    )
    ignore_eos: bool = Field(
        default=False,
        description="Keep sampling past EOS until `max_tokens` (benchmarks); `stop_token_ids` still stop.",
    )
    seed: int | None = Field(default=None, description="Per-request seed for reproducible sampling.")
    logprobs: bool = Field(default=True, description="Return the logprob of each sampled token.")


@dataclass(slots=True)
class GenerationRequest:
    """One prompt to complete: token ids, or chat messages the engine renders with its chat template."""

    prompt_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    multimodal: dict[str, Any] | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # extra variables for the chat template when `messages` are rendered, e.g. {"enable_thinking": False} for
    # Qwen3 (vLLM's and TRL's `chat_template_kwargs`); ignored for `prompt_ids`
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.prompt_ids is None) == (self.messages is None):
            raise ValueError("GenerationRequest needs exactly one of `prompt_ids` or `messages`.")
        check_chat_template_kwargs(self.chat_template_kwargs, "GenerationRequest.chat_template_kwargs")
        if self.prompt_ids is not None and len(self.prompt_ids) == 0:
            raise ValueError("GenerationRequest.prompt_ids is empty: give at least one token id.")


RESERVED_TEMPLATE_ARGUMENTS = frozenset(
    {"conversation", "messages", "tokenize", "add_generation_prompt", "return_dict", "tools"}
)
"""`apply_chat_template` arguments the renderers set themselves; a template variable may not override them."""


def template_arguments_clash(kwargs: dict[str, Any]) -> str | None:
    """Why `kwargs` cannot be template variables (they would override how the prompt is rendered), or None."""
    clash = sorted(RESERVED_TEMPLATE_ARGUMENTS & set(kwargs))
    if not clash:
        return None
    return (
        f"{', '.join(clash)} cannot be set there (the renderer sets them); pass only the template's own "
        "variables, e.g. {enable_thinking: false}"
    )


def check_chat_template_kwargs(kwargs: dict[str, Any], field_name: str) -> None:
    """Refuse template variables that would override how the prompt is rendered (naming `field_name`)."""
    problem = template_arguments_clash(kwargs)
    if problem:
        raise ValueError(f"{field_name}: {problem}")


@dataclass(slots=True)
class Completion:
    """One sampled continuation. `logprobs[i]` is the sampling logprob of `token_ids[i]`."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    logprobs: list[float] | None = None
    stop_reason: str | int | None = None  # the stop string or token id that ended it, if any
    sample_index: int = 0  # which of the request's n samples
    timing: dict[str, float] = field(default_factory=dict)  # e.g. {"latency_s": ..., "ttft_s": ...}
    # the policy version (training step of the weights) that sampled each token; None when the engine does not
    # track versions. A completion generated across an in-flight weight update spans versions.
    policy_versions: list[int] | None = None

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"Completion {self.request_id}: {len(self.logprobs)} logprobs for {len(self.token_ids)} tokens"
            )
        if self.policy_versions is not None and len(self.policy_versions) != len(self.token_ids):
            raise ValueError(
                f"Completion {self.request_id}: {len(self.policy_versions)} policy_versions for "
                f"{len(self.token_ids)} tokens"
            )
