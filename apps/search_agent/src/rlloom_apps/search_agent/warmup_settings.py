"""`search-agent warmup`'s settings, in a module that imports neither torch nor the agent package: the CLI builds
its flags (and `--help`) from these fields' defaults and descriptions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from rlloom.agent import AgentLoopConfig


class WarmupSettings(BaseModel):
    """The warm-up's training and conversation limits; measuring is greedy, with Search-R1's limits by default."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=100, ge=0, description="AdamW steps on random batches of demonstrations.")
    lr: float = Field(default=1e-5, gt=0, description="Learning rate (a fine-tuning rate for a pretrained model).")
    batch_size: int = Field(default=8, ge=1, description="Demonstrations per step.")
    max_tokens_per_micro_batch: int = Field(
        default=1024,
        ge=1,
        description="Tokens per forward/backward: a step's rows run in micro-batches of this many tokens (the "
        "loss is the same; memory grows with it: SmolLM2-135M float32 keeps ~1.5 MB of activations per token).",
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in backward: less memory, about a third more compute."
    )
    max_rows: int | None = Field(default=None, ge=1, description="Demonstrate the first N training rows only.")
    top_k: int = Field(default=3, ge=1, description="Passages per search (Search-R1: 3).")
    max_turns: int = Field(default=5, ge=2, description="Model turns per measured conversation.")
    max_tokens_per_turn: int = Field(default=500, ge=1, description="New tokens per measured model turn.")
    max_obs_tokens: int = Field(default=500, ge=1, description="Tokens of one <information> block at most.")
    max_total_tokens: int = Field(default=4096, ge=2, description="Prompt + response tokens per conversation.")
    seed: int = Field(default=0, description="Batch order seed.")
    progress: bool = Field(default=True, description="Show progress bars.")

    def loop_config(self, *, max_turns: int | None = None) -> AgentLoopConfig:
        """The agent loop's limits, greedy (`max_turns` overrides the setting: 2 for a demonstration)."""
        from rlloom.agent import AgentLoopConfig
        from rlloom.core_rl.contracts import SamplingParams

        return AgentLoopConfig(
            max_turns=max_turns or self.max_turns,
            max_tokens_per_turn=self.max_tokens_per_turn,
            max_obs_tokens=self.max_obs_tokens,
            max_total_tokens=self.max_total_tokens,
            sampling=SamplingParams(temperature=0.0),
            compute_reward=True,
            progress=self.progress,
        )
