"""Rewards for agent conversations: an outcome score plus optional format and tool-use terms, each logged.

The outcome is any rlloom-rewards scorer (`(response, ground_truth, *, extra_info) -> float | ScoreResult`),
given only the text the *model* wrote, never the prompt or tool outputs: Search-R1 scored prompt + response
and needed a "at least two `<answer>` tags" rule to skip the prompt's example answer; we do not. The format
term is the fraction of model turns the environment's parser found well formed; the tool-use term is the
fraction of tool calls that succeeded (0 with no calls). Components are always reported, whatever their weight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.rewards.types import Scorer, as_result


@dataclass(slots=True)
class EpisodeSummary:
    """What a reward may look at: the model's own text and counts the environment kept."""

    model_text: str
    ground_truth: Any
    extra_info: Mapping[str, Any]
    turns_well_formed: int
    turns: int
    tool_calls: int = 0
    tool_errors: int = 0


@dataclass(slots=True)
class AgentRubric:
    """score = outcome + format_weight * format + tool_use_weight * tool_use (all three always reported).

    A crashing outcome scorer makes the score 0 (format and tool use are not rewarded alone) with the error kept;
    `format` and `tool_use` are still reported."""

    outcome: Scorer
    format_weight: float = 0.0
    tool_use_weight: float = 0.0

    async def ascore(self, episode: EpisodeSummary) -> RewardOutput:
        """`score` on a worker thread: an outcome scorer may run code or a model for seconds, and run on the event
        loop it would stall every other conversation (their tool calls, searches and next turns) meanwhile."""
        return await asyncio.to_thread(self.score, episode)

    def score(self, episode: EpisodeSummary) -> RewardOutput:
        fmt = episode.turns_well_formed / episode.turns if episode.turns else 0.0
        ok_calls = episode.tool_calls - episode.tool_errors
        tool_use = ok_calls / episode.tool_calls if episode.tool_calls else 0.0
        try:
            result = as_result(self.outcome(episode.model_text, episode.ground_truth, extra_info=episode.extra_info))
        except Exception as exc:  # a broken scorer scores 0 with a reason, it never kills the rollout
            return RewardOutput(
                score=0.0,
                components={"outcome": 0.0, "format": fmt, "tool_use": tool_use},
                error=f"{type(exc).__name__}: {exc}",
            )
        components = {
            **{f"outcome/{k}": v for k, v in result.components.items()},
            "outcome": result.score,
            "format": fmt,
            "tool_use": tool_use,
        }
        total = result.score + self.format_weight * fmt + self.tool_use_weight * tool_use
        return RewardOutput(score=total, components=components, error=result.error)
