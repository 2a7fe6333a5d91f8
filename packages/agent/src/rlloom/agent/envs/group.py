"""Several environments in one run, each sample routed to its own (verifiers' `EnvGroup`).

A multi-task run (search QA next to code, math with and without tools) needs each sample to meet its own tools,
stop strings, prompt and rubric. `EnvGroup` is an `Environment` that picks the environment for a sample by one of
its fields (`data_source` by default, as rlloom-rewards routes scorers) when the conversation starts, then hands
every call to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rlloom.agent.environment import Environment, Prompt, Sample, StepResult, step_takes_last_turn
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory


class EnvGroup:
    """Routes each conversation to `makers[value]()`, `value` being the sample's `key` field (or that key of its
    row, kept in `extra_info`); make one per conversation, like any environment:
    `AgentLoop(engine, tokenizer, lambda: EnvGroup({"nq": make_search_env, "mbpp": make_code_env}))`."""

    def __init__(self, makers: Mapping[str, Callable[[], Environment]], *, key: str = "data_source") -> None:
        if not makers:
            raise ValueError("EnvGroup needs at least one environment maker, e.g. {'nq': lambda: SearchEnv(...)}")
        self.makers = dict(makers)
        self.key = key
        self._env: Environment | None = None
        self._takes_last_turn = False

    @property
    def env(self) -> Environment:
        """The environment this conversation was routed to (after `reset`)."""
        if self._env is None:
            raise RuntimeError("EnvGroup: call reset(sample) first; the sample decides the environment")
        return self._env

    @property
    def stop(self) -> list[str]:
        return self.env.stop

    def reset(self, sample: Sample) -> Prompt:
        # a Sample field (data_source) or a row key kept in extra_info (e.g. a dedicated "env" column)
        name = getattr(sample, self.key) if self.key in type(sample).model_fields else sample.extra_info.get(self.key)
        if name not in self.makers:
            valid = ", ".join(repr(n) for n in self.makers)
            raise ValueError(
                f"EnvGroup: sample field {self.key!r} is {name!r}, which names no environment; give each row "
                f"{self.key} one of {valid}, or add a maker for it"
            )
        self._env = self.makers[str(name)]()
        self._takes_last_turn = step_takes_last_turn(self._env)
        return self._env.reset(sample)

    async def step(self, action: str, *, last_turn: bool = False) -> StepResult:
        if self._takes_last_turn:
            return await self.env.step(action, last_turn=last_turn)
        return await self.env.step(action)

    async def reward(self, trajectory: Trajectory) -> RewardOutput:
        return await self.env.reward(trajectory)
