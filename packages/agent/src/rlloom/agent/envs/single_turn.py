"""`SingleTurnEnv`: one completion, scored. The multi-turn machinery with one turn, so that plain RLVR tasks
(math, QA without tools) go through the same loop, metrics and rewards as agents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlloom.agent.environment import Prompt, Sample, StepResult
from rlloom.agent.parsers import XMLParser
from rlloom.agent.rewards import AgentRubric, EpisodeSummary
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory


def chat_messages(
    sample: Sample, *, system_prompt: str | None = None, template: str = "{question}"
) -> list[dict[str, Any]]:
    """The sample's chat prompt: its own `prompt` messages, else `template` filled with its question."""
    if sample.prompt is not None:
        messages = [dict(m) for m in sample.prompt]
    elif sample.question is not None:
        messages = [{"role": "user", "content": template.format(question=sample.question)}]
    else:
        raise ValueError("sample has neither `prompt` messages nor a `question`")
    if system_prompt is not None and (not messages or messages[0].get("role") != "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


class SingleTurnEnv:
    """Prompt -> one model turn -> reward."""

    def __init__(
        self,
        rubric: AgentRubric,
        *,
        system_prompt: str | None = None,
        template: str = "{question}",
        parser: XMLParser | None = None,
        stop: Sequence[str] = (),
    ) -> None:
        self.rubric = rubric
        self.system_prompt = system_prompt
        self.template = template
        self.parser = parser
        self._stop = list(stop)
        self._sample: Sample | None = None
        self._action = ""

    @property
    def stop(self) -> list[str]:
        return self._stop

    def reset(self, sample: Sample) -> Prompt:
        self._sample = sample
        return Prompt(messages=chat_messages(sample, system_prompt=self.system_prompt, template=self.template))

    async def step(self, action: str, *, last_turn: bool = False) -> StepResult:
        self._action = action
        return StepResult(None, True, {})

    async def reward(self, trajectory: Trajectory) -> RewardOutput:
        if self._sample is None:
            raise RuntimeError("SingleTurnEnv.reward called before reset()")
        well_formed = int(self.parser.parse(self._action).format_ok) if self.parser is not None else 1
        episode = EpisodeSummary(
            model_text=self._action,
            ground_truth=self._sample.ground_truth,
            extra_info=self._sample.extra_info,
            turns_well_formed=well_formed,
            turns=1,
        )
        return await self.rubric.ascore(episode)
