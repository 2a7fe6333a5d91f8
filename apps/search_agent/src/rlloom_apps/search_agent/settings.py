"""The `search:` section of a search-agent training config, and loading a config that has one (torch-free: `search-agent
train` checks the config with it before anything heavy loads).

A config file holds core-rl's `RLConfig` sections (model, data, rollout, algorithm, actor, critic, trainer) plus
`search:`, what the agent loop and the retriever need. Overrides use the same dotted form for both
(`search.max_turns=2`, `actor.lr=1e-6`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rlloom.core_rl.config import RLConfig, load_config_with_section

CONFIGS = Path(__file__).parent / "configs"
"""The bundled configs (grpo, ppo, grpo_8gpu): here, not in train.py, so a config is checked before torch loads."""


class FormatRewardSettings(BaseModel):
    """The three scores of Search-R1's `reward_model` section; defaults are its v0.3 launch scripts' values."""

    model_config = ConfigDict(extra="forbid")

    structure_format_score: float = Field(
        default=0.2,
        ge=0.0,
        le=1.0,
        description="Valid sequence with a wrong or no answer; 1 minus it for a correct answer in an invalid sequence.",
    )
    final_format_score: float = Field(default=0.1, ge=0.0, le=1.0, description="Wrong answer, invalid sequence.")
    retrieval_score: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Added to a valid wrong answer when a gold alias was retrieved."
    )
    answer_score: Literal["em", "f1"] = Field(
        default="em",
        description="em: Search-R1's exact match (an answer is right or wrong); f1: the answer's token F1 moves "
        "each score linearly from the wrong answer's to the right one's (R1-Searcher's F1 answer reward), so a "
        "partly right answer earns part of the difference. At F1 0 or 1 the two agree.",
    )


class SearchSettings(BaseModel):
    """Search-R1's defaults: top-3 passages, 4 search turns + a final answer turn, 500-token observations, a
    4,096-token context."""

    model_config = ConfigDict(extra="forbid")

    top_k: int = Field(default=3, ge=1, description="Passages per search (Search-R1 always asks for 3).")
    max_turns: int = Field(
        default=5,
        ge=1,
        description="Model turns per conversation, the last one without search. Search-R1's max_turns counts its "
        "search turns and adds a final answer turn: its v0.2 max_turns=4 is 5 here.",
    )
    max_obs_tokens: int = Field(default=500, ge=1, description="Tokens of one <information> block at most.")
    max_total_tokens: int = Field(default=4096, ge=2, description="Prompt + response tokens per conversation.")
    max_concurrency: int = Field(default=512, ge=1, description="Conversations in flight at once.")
    search_threads: int = Field(default=64, ge=1, description="Threads running blocking retrieval calls.")
    prefix_cache_tokens: int = Field(
        default=1 << 16,
        ge=0,
        description="Rollout engine: finished turns' keys/values kept (tokens in all), so a conversation's next "
        "turn prefills only its new tokens; dropped whenever the weights change. 0 turns it off.",
    )
    retrieval_api: Literal["native", "search-r1"] = Field(
        default="native", description="Wire format of --retrieval-url: rlloom's server, or Search-R1's /retrieve."
    )
    format_reward: FormatRewardSettings | None = Field(
        default=None,
        description="Search-R1 v0.3's format reward (`qa_em_format`) instead of plain exact match; `{}` takes its "
        "published scores (structure 0.2, final 0.1, retrieval 0).",
    )


def load_train_config(path: str | Path, overrides: Sequence[str] = ()) -> tuple[RLConfig, SearchSettings]:
    """Read the YAML, apply `key=value` overrides (values parsed as YAML), validate both parts."""
    return load_config_with_section(path, "search", SearchSettings, overrides)
