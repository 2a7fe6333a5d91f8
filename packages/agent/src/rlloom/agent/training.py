"""Train agents with core-rl's `Trainer`: `AgentLoop` as its rollout collector, the environment's reward as its reward.

    trainer = Trainer(
        config,
        engine=lambda module: HFEngine(module, tokenizer),
        collect_factory=agent_collector(tokenizer, make_env, AgentLoopConfig(max_turns=4)),
        reward_fn=env_reward,
        train_data=rows,
    )

Every turn samples with the trainer's `SamplingParams` (config `rollout.*`): `n` conversations per row share a
group id, and `rollout.max_tokens` caps each model turn together with `AgentLoopConfig.max_tokens_per_turn` (the
smaller wins). Turn, observation and length limits come from the `AgentLoopConfig`, whose own `sampling` is
replaced by the trainer's except for its stop strings, which are kept alongside the trainer's and the env's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlloom.agent.environment import Environment
from rlloom.agent.loop import AgentLoop, AgentLoopConfig
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.contracts.protocols import RewardOutput, RolloutEngine
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import Row
from rlloom.core_rl.phases.collection import CollectFactory, CollectFn


class AgentCollector:
    """The `collect_factory` `agent_collector` returns. It says which chat-template variables its prompts are
    rendered with (`chat_template_kwargs`), so the trainer can check them against `data.apply_chat_template_kwargs`."""

    def __init__(self, tokenizer: Any, make_env: Callable[[], Environment], config: AgentLoopConfig) -> None:
        self.tokenizer, self.make_env, self.config = tokenizer, make_env, config
        self.chat_template_kwargs = dict(config.chat_template_kwargs)

    def __call__(self, engine: RolloutEngine) -> CollectFn:
        def collect(rows: Sequence[Row], sampling: SamplingParams, prefix: str) -> list[Trajectory]:
            loop = AgentLoop(engine, self.tokenizer, self.make_env, loop_config_for(self.config, sampling))
            return loop.run(rows, n=sampling.n, group_prefix=prefix)

        return collect


def agent_collector(
    tokenizer: Any, make_env: Callable[[], Environment], config: AgentLoopConfig | None = None
) -> CollectFactory:
    """A `collect_factory` for the `Trainer`: multi-turn rollouts of `make_env()` environments on its engine."""
    return AgentCollector(tokenizer, make_env, config or AgentLoopConfig())


def loop_config_for(base: AgentLoopConfig, sampling: SamplingParams) -> AgentLoopConfig:
    """`base` sampling every turn with the trainer's `sampling` (see the module docstring for what wins)."""
    stop = list(dict.fromkeys([*base.sampling.stop, *sampling.stop]))
    return base.model_copy(
        update={
            "sampling": sampling.model_copy(update={"n": 1, "stop": stop}),
            "max_tokens_per_turn": min(base.max_tokens_per_turn, sampling.max_tokens),
        }
    )


def env_reward(trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
    """The reward each environment gave its trajectory in the loop (its rubric), as the trainer's `reward_fn`."""
    outputs = []
    for i, traj in enumerate(trajectories):
        if traj.reward is None:
            raise ValueError(
                f"trajectory {i} has no reward: the AgentLoop ran with compute_reward=False; set "
                "AgentLoopConfig.compute_reward=True or pass the Trainer a reward_fn that scores the text"
            )
        outputs.append(RewardOutput(traj.reward, dict(traj.reward_components), traj.reward_error))
    return outputs
