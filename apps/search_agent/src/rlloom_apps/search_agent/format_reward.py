"""Search-R1 v0.3's format reward (`qa_em_format`, its `train_grpo_format.sh`/`train_ppo_format.sh` runs) for
`search-agent train`, chosen with the config's `search.format_reward:` section.

Search-R1 scores the whole decoded sequence after the assistant marker: the model's turns with the
`<information>` blocks between them. `SearchEnv` keeps only the model's own turns, so `FormatRewardSearchEnv`
also keeps each observation as shown and scores the turns and observations in order.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlloom.agent import SearchEnv
from rlloom.agent.environment import StepResult
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.rewards.format import search_r1_format_reward, search_r1_sequence
from rlloom.rewards.qa import exact_match, extract_tagged_answer, qa_golds


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


class FormatRewardSearchEnv(SearchEnv):
    """`SearchEnv` rewarded by Search-R1's `qa_em_format` over the turns and the observations between them."""

    def __init__(self, *args: Any, format_reward: FormatRewardSettings, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.format_reward = format_reward
        self._transcript: list[str] = []

    async def step(self, action: str, *, last_turn: bool = False) -> StepResult:
        result = await super().step(action, last_turn=last_turn)
        self._transcript.append(action)
        obs = result.observation
        if obs is not None and obs.text is not None:
            self._transcript.append(f"{obs.before}{obs.text}{obs.after}")
        return result

    async def reward(self, trajectory: Trajectory) -> RewardOutput:
        if self._sample is None:
            raise RuntimeError("FormatRewardSearchEnv.reward called before reset()")
        return score_transcript("".join(self._transcript), self._sample.ground_truth, self.format_reward)


def score_transcript(text: str, ground_truth: Any, settings: FormatRewardSettings) -> RewardOutput:
    """The reward of one conversation's text (model turns and `<information>` blocks), with EM and validity
    logged beside it."""
    try:
        golds = qa_golds(ground_truth)
    except (TypeError, ValueError) as exc:
        return RewardOutput(score=0.0, error=f"bad ground_truth: {exc}")
    check = search_r1_format_reward(text, golds, **settings.model_dump())
    answer = extract_tagged_answer(text)
    em = exact_match(answer, golds) if answer is not None else 0.0
    valid = search_r1_sequence(text).score
    return RewardOutput(score=check.score, components={"em": em, "format_valid": valid})
