"""`search-agent warmup`'s settings, in a module that imports neither torch nor the agent package: the CLI builds
its flags (and `--help`) from these fields' defaults and descriptions. The supervised step's settings (--lr,
--batch-size, --max-tokens-per-micro-batch, --gradient-checkpointing, --max-rows, --seed) are core-rl's, shared with
`reasoning warmup`; this app adds how long to train, in steps, and the measured conversations' limits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from rlloom.core_rl.workers import WarmupSettingsBase

if TYPE_CHECKING:
    from rlloom.agent import AgentLoopConfig


class WarmupSettings(WarmupSettingsBase):
    """The warm-up's training and conversation limits; measuring is greedy, with Search-R1's limits by default."""

    steps: int = Field(default=100, ge=0, description="AdamW steps on random batches of demonstrations.")
    top_k: int = Field(default=3, ge=1, description="Passages per search (Search-R1: 3).")
    max_turns: int = Field(default=5, ge=2, description="Model turns per measured conversation.")
    max_tokens_per_turn: int = Field(default=500, ge=1, description="New tokens per measured model turn.")
    max_obs_tokens: int = Field(default=500, ge=1, description="Tokens of one <information> block at most.")
    max_total_tokens: int = Field(default=4096, ge=2, description="Prompt + response tokens per conversation.")
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
