"""`search-agent eval`'s settings, in a module that imports neither torch nor the agent package: the CLI builds
its flags (and `--help`) from these fields' defaults and descriptions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlloom.core_rl.contracts import SamplingParams, template_arguments_clash

if TYPE_CHECKING:
    from rlloom.agent import AgentLoopConfig


class EvalSettings(BaseModel):
    """Search-R1's evaluation limits (top-3, 4 search turns + a final one, 500 tokens a turn and an observation),
    greedy; `n` sampled conversations per question (avg@n) when a narrower per-question mean is worth n times the
    decoding."""

    model_config = ConfigDict(extra="forbid")

    top_k: int = Field(default=3, ge=1, description="Passages per search (and in the RAG prompt).")
    max_turns: int = Field(
        default=5,
        ge=1,
        description="Model turns per conversation, the last without search (the search method); Search-R1's "
        "max_turns=4 search turns plus its final answer turn.",
    )
    max_tokens_per_turn: int = Field(default=500, ge=1, description="New tokens per model turn.")
    max_obs_tokens: int = Field(default=500, ge=1, description="Tokens of one <information> block at most.")
    max_total_tokens: int = Field(default=4096, ge=2, description="Prompt + response tokens per conversation.")
    max_concurrency: int = Field(default=256, ge=1, description="Conversations in flight at once.")
    temperature: float = Field(default=0.0, ge=0.0, description="0: greedy, as Search-R1 validates.")
    seed: int | None = Field(
        default=None,
        description="Sampling seed when temperature > 0: conversation c (question i's sample k is c = i * n + k) "
        "samples turn t with seed + 1000003 * c + t, the agent loop's scheme.",
    )
    n: int = Field(
        default=1,
        ge=1,
        description="Conversations per question (eval only); the figures average all of them (avg@n). Needs "
        "--temperature > 0.",
    )
    fallback_to_text: bool = Field(
        default=False,
        description="Score the whole reply when it has no <answer> tag (lenient; for models not trained on the tags).",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra chat-template variables as JSON, e.g. '{\"enable_thinking\": false}' for Qwen3 (what the "
        "model was trained with: data.apply_chat_template_kwargs).",
    )
    progress: bool = Field(default=True, description="Show a progress bar.")

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, value: dict[str, Any]) -> dict[str, Any]:
        """Refused here, with the flag named, before the model loads (the agent loop would refuse it after)."""
        problem = template_arguments_clash(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _sampled_when_several(self) -> EvalSettings:
        """n greedy conversations of one question are one conversation n times: the mean would be no narrower."""
        if self.n > 1 and self.temperature == 0:
            raise ValueError(
                f"--n {self.n} needs --temperature > 0 (greedy decoding, --temperature 0, gives {self.n} identical "
                "conversations per question); pass e.g. --temperature 0.6, or --n 1 for the greedy figure"
            )
        return self

    def loop_config(self, *, max_turns: int | None = None, compute_reward: bool = True) -> AgentLoopConfig:
        """The agent loop's limits and sampling (`max_turns` overrides the setting: 1 for one-turn methods)."""
        from rlloom.agent import AgentLoopConfig

        return AgentLoopConfig(
            max_turns=max_turns or self.max_turns,
            max_tokens_per_turn=self.max_tokens_per_turn,
            max_obs_tokens=self.max_obs_tokens,
            max_total_tokens=self.max_total_tokens,
            max_concurrency=self.max_concurrency,
            sampling=SamplingParams(temperature=self.temperature, seed=self.seed),
            compute_reward=compute_reward,
            chat_template_kwargs=dict(self.chat_template_kwargs),
            progress=self.progress,
        )
