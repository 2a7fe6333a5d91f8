"""Per-token policy versions through the agent loop: a conversation that spans in-flight weight updates (HFEngine
paused between two turns and again in the middle of one) carries each sampled token's version, and every
observation token the version of the last sampled token before it."""

from __future__ import annotations

import asyncio
import threading
import time
from itertools import groupby
from typing import Any

from rlloom.agent.conversation import ConversationTokens
from rlloom.agent.environment import Observation, Prompt, Sample, StepResult
from rlloom.agent.loop import AgentLoop, AgentLoopConfig
from rlloom.agent.turns import Segment
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig

TURN_TOKENS = 48


def _update(engine: HFEngine, version: int) -> None:
    """An in-flight update: pause, new weights (the final norm scaled), resume under `version`."""
    engine.pause_generation()
    norm = engine.model.get_parameter("model.norm.weight")
    engine.update_weights({"model.norm.weight": norm.detach() * 1.5})
    engine.resume_generation(version)


class _UpdatingEnv:
    """Three turns; after the first it updates the engine to version 1 at once, and has a thread update it to
    version 2 once the second turn has decoded a few tokens."""

    stop: list[str] = []  # noqa: RUF012  (the Environment protocol's attribute; never mutated)

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine
        self.turns = 0
        self.mid_turn: threading.Thread | None = None

    def reset(self, sample: Sample) -> Prompt:
        return Prompt(text=f"Q: {sample.question}\n")

    async def step(self, action: str, *, last_turn: bool = False) -> StepResult:
        self.turns += 1
        if self.turns == 1:
            await asyncio.to_thread(_update, self.engine, 1)
            start = self.engine.decode_stats.steps
            self.mid_turn = threading.Thread(target=self._update_mid_turn, args=(start,))
            self.mid_turn.start()
        return StepResult(Observation(text=" <obs> "), done=False)

    def _update_mid_turn(self, start: int) -> None:
        while self.engine.decode_stats.steps < start + 5:
            time.sleep(0.0005)
        _update(self.engine, 2)

    async def reward(self, trajectory: Trajectory) -> RewardOutput:
        return RewardOutput(score=0.0)


def test_a_conversation_across_updates_carries_each_tokens_version(tokenizer: Any) -> None:
    model = tiny_qwen2(tokenizer, seed=0).eval()
    engine = HFEngine(model, tokenizer, HFEngineConfig(gather_s=0.0))
    envs: list[_UpdatingEnv] = []

    def make_env() -> _UpdatingEnv:
        envs.append(_UpdatingEnv(engine))
        return envs[-1]

    cfg = AgentLoopConfig(
        max_turns=3,
        max_tokens_per_turn=TURN_TOKENS,
        max_total_tokens=1024,
        sampling=SamplingParams(temperature=1.0, seed=0, ignore_eos=True),
    )
    try:
        [traj] = AgentLoop(engine, tokenizer, make_env, cfg).run([{"question": "q", "answer": "a"}])
    finally:
        engine.close()
    assert envs[0].mid_turn is not None
    envs[0].mid_turn.join(30)
    assert traj.policy_versions is not None
    # runs of the mask: turn 1, observation 1, turn 2, observation 2, turn 3
    runs: list[tuple[int, list[int]]] = []
    position = 0
    for mask, run in groupby(traj.loss_mask):
        n = len(list(run))
        runs.append((mask, traj.policy_versions[position : position + n]))
        position += n
    assert [m for m, _ in runs] == [1, 0, 1, 0, 1]
    (_, turn1), (_, obs1), (_, turn2), (_, obs2), (_, turn3) = runs
    assert len(turn1) == len(turn2) == len(turn3) == TURN_TOKENS
    assert set(turn1) == {0} and set(obs1) == {0}  # the observation takes the last sampled token's version
    j = turn2.index(2)
    assert 0 < j < TURN_TOKENS and turn2 == [1] * j + [2] * (TURN_TOKENS - j)  # updated mid-turn
    assert set(obs2) == {2} and set(turn3) == {2}


def test_observation_after_a_dropped_eos_keeps_the_dropped_tokens_version() -> None:
    conv = ConversationTokens([1, 2], max_total_tokens=100)
    conv.add_model_turn([5, 6, 0], [-0.1, -0.2, -0.3], [3, 4, 4])
    assert conv.drop_trailing_model_token({0})
    conv.add_context([Segment([7, 8], truncatable=True)], None, [9])
    conv.add_model_turn([5], [-0.5], [6])
    assert conv.versions == [3, 4, 4, 4, 6] and conv.has_versions


def test_an_engine_without_versions_gives_none(tokenizer: Any, replay_engine: Any) -> None:
    from rlloom.agent.envs.tool import ToolEnv
    from rlloom.agent.rewards import AgentRubric
    from rlloom.agent.tools import Toolset

    engine = replay_engine(tokenizer, lambda ctx: "the answer")
    env = lambda: ToolEnv(Toolset([]), AgentRubric(lambda r, g, *, extra_info=None: 0.0))  # noqa: E731
    [traj] = AgentLoop(engine, tokenizer, env).run([{"question": "q", "answer": "a"}])
    assert traj.policy_versions is None and traj.rollout_logprobs is not None
