"""Agents trained by core-rl's `Trainer`: `agent_collector` as its rollout collector, `env_reward` as its reward.

The collector must sample every turn with the trainer's knobs and name groups the trainer's way; the reward must
be what each environment's rubric gave. Then a real run: HFEngine on the actor's own module, SearchEnv, two GRPO
steps, with the logged rollout metrics checked against means computed here from the trajectories themselves.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from rlloom.agent import AgentLoopConfig, AgentRubric, SearchEnv, SearchEnvConfig, agent_collector, env_reward
from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.core_rl.trainer import Trainer
from rlloom.rollout.hf.engine import HFEngine

ROWS = [
    {"question": "what is the capital of France", "golden_answers": "Paris"},
    {"question": "where is France", "golden_answers": "Europe"},
]


def exact_answer(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
    found = re.findall(r"<answer>(.*?)</answer>", response, re.DOTALL)
    return float(bool(found) and found[-1].strip() == ground_truth)


def search_then_answer(context: str) -> str:
    if context.count("<information>") < 2:  # the prompt mentions the tag once
        return "<search> capital </search>"
    return "<answer> Paris </answer>"


@pytest.fixture
def make_env(fixed_retriever: Any, hit: Any) -> Any:
    retriever = fixed_retriever([hit("7", 2.0, "Paris is the capital of France.", "Paris")])
    return lambda: SearchEnv(retriever, AgentRubric(exact_answer, format_weight=0.5), SearchEnvConfig(top_k=1))


def test_collector_samples_every_turn_with_the_trainers_knobs(
    tokenizer: Any, replay_engine: Any, make_env: Any
) -> None:
    engine = replay_engine(tokenizer, search_then_answer)
    config = AgentLoopConfig(max_turns=3, max_tokens_per_turn=64, sampling=SamplingParams(stop=["<halt>"]))
    collect = agent_collector(tokenizer, make_env, config)(engine)
    trainer_sampling = SamplingParams(n=3, temperature=0.7, top_p=0.9, top_k=5, max_tokens=40, stop=["<end>"])

    trajectories = collect(ROWS, trainer_sampling, "s4r1")

    assert [t.group_id for t in trajectories] == ["s4r1-0"] * 3 + ["s4r1-1"] * 3
    assert [t.ground_truth for t in trajectories] == ["Paris"] * 3 + ["Europe"] * 3
    assert len(engine.requests) == 12  # two turns (search, answer) per conversation
    for request in engine.requests:
        s = request.sampling
        assert (s.n, s.temperature, s.top_p, s.top_k, s.max_tokens) == (1, 0.7, 0.9, 5, 40)  # 40 < 64 per turn
        assert {"<halt>", "<end>", "</search>", "</answer>"} <= set(s.stop)
    # the rubric: exact answer (1 for Paris, 0 for Europe) + 0.5 x well-formed turns (both turns are)
    assert [t.reward for t in trajectories] == [1.5] * 3 + [0.5] * 3
    rewards = env_reward(trajectories)
    assert [r.score for r in rewards] == [1.5] * 3 + [0.5] * 3
    assert rewards[0].components == trajectories[0].reward_components
    assert rewards[0].components["outcome"] == 1.0 and rewards[3].components["outcome"] == 0.0


def test_per_turn_budget_is_the_smaller_of_loop_and_trainer(tokenizer: Any, replay_engine: Any, make_env: Any) -> None:
    engine = replay_engine(tokenizer, search_then_answer)
    collect = agent_collector(tokenizer, make_env, AgentLoopConfig(max_tokens_per_turn=30))(engine)
    collect(ROWS[:1], SamplingParams(max_tokens=200), "p")
    assert {r.sampling.max_tokens for r in engine.requests} == {30}


def test_env_reward_refuses_trajectories_the_loop_did_not_score() -> None:
    unscored = Trajectory(prompt_ids=[1], response_ids=[2], loss_mask=[1])
    with pytest.raises(ValueError, match="compute_reward"):
        env_reward([unscored])


def test_trainer_takes_collect_or_collect_factory_not_both(tmp_path: Path, tokenizer: Any) -> None:
    config = load_config(None, [f"model.path={tmp_path}", f"trainer.output_dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match="collect_factory"):
        Trainer(
            config,
            engine=lambda module: HFEngine(module, tokenizer),
            reward_fn=env_reward,
            train_data=ROWS,
            collect=lambda rows, sampling, prefix: [],
            collect_factory=lambda engine: lambda rows, sampling, prefix: [],
        )


def vowel_share(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
    """A reward that varies across a random policy's samples, so GRPO has non-zero advantages to train on."""
    letters = [c for c in response.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


def test_grpo_trains_a_search_agent_through_the_trainer(
    tmp_path: Path, tokenizer: Any, fixed_retriever: Any, hit: Any
) -> None:
    model_dir = tmp_path / "model"
    tiny_qwen2(tokenizer, seed=0).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    start = {k: v.clone() for k, v in tiny_qwen2(tokenizer, seed=0).state_dict().items()}
    config = load_config(
        None,
        [
            f"model.path={model_dir}",
            f"trainer.output_dir={tmp_path / 'run'}",
            "data.train_batch_size=2",
            "rollout.n=3",
            "rollout.max_tokens=12",
            "algorithm.advantage.estimator=grpo",
            "actor.lr=1e-3",
            "actor.mini_batch_size=2",
            "trainer.total_steps=2",
            "trainer.save_every=0",
            "trainer.val_every=2",
            "trainer.seed=3",
            "trainer.device=cpu",
            "trainer.trackers=[jsonl]",
        ],
    )
    retriever = fixed_retriever([hit("7", 2.0, "Paris is the capital of France.", "Paris")])
    loop_config = AgentLoopConfig(max_turns=3, max_obs_tokens=24, max_total_tokens=512)
    seen: list[list[Trajectory]] = []
    validated: list[list[Trajectory]] = []
    engines: list[HFEngine] = []

    def make_engine(module: torch.nn.Module) -> HFEngine:
        engines.append(HFEngine(module, tokenizer))
        return engines[-1]

    def recording(engine: Any) -> Any:
        env_config = SearchEnvConfig(template="Search with <search> q </search>. Question: {question}\n", top_k=1)
        collect = agent_collector(
            tokenizer, lambda: SearchEnv(retriever, AgentRubric(vowel_share), env_config), loop_config
        )(engine)

        def collect_and_keep(rows: Any, sampling: SamplingParams, prefix: str) -> list[Trajectory]:
            kept = validated if prefix.startswith("val") else seen
            kept.append(collect(rows, sampling, prefix))
            return kept[-1]

        return collect_and_keep

    trainer = Trainer(
        config,
        engine=make_engine,
        collect_factory=recording,
        reward_fn=env_reward,
        train_data=ROWS,
        val_data=ROWS[:1],
    )
    try:
        trainer.fit()
    finally:
        for engine in engines:
            engine.close()

    assert len(seen) == 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [line for line in lines if "reward/mean" in line]
    assert len(logged) == 2
    for trajectories, line in zip(seen, logged, strict=True):
        assert sorted(t.group_id for t in trajectories) == sorted([f"s{line['step']}r1-{i}" for i in (0, 1)] * 3)
        # a random character model never writes a valid action: each turn but the last gets SearchEnv's correction;
        # a last turn cut at rollout.max_tokens (no EOS at its end) finishes 'length', otherwise 'max_turns'
        eos = engines[0].eos_token_ids
        for t in trajectories:
            assert t.metrics["turns"] == 3
            assert t.finish_reason == ("max_turns" if t.response_ids[-1] in eos else "length")
        assert all(0 in t.loss_mask for t in trajectories)  # the corrections are context, not trained on
        for key in ("turns", "invalid_actions", "context_tokens", "model_tokens"):
            expected = sum(t.metrics[key] for t in trajectories) / len(trajectories)
            assert line[f"rollout/{key}/mean"] == pytest.approx(expected)
        assert line["reward/mean"] == pytest.approx(sum(t.reward or 0.0 for t in trajectories) / len(trajectories))
        # nobody searched or answered: logged as 0, not left out of metrics.jsonl (a gap in every curve's start)
        assert (line["rollout/searches/mean"], line["rollout/answers/mean"]) == (0.0, 0.0)
        assert line["batch/response_tokens"] == sum(t.num_model_tokens for t in trajectories)
    # validation logs the held-out conversations' own metrics too (searches, turns...) beside their reward
    (val_line,) = [line for line in lines if "val/reward/mean" in line]
    (val_trajectories,) = validated
    for key in ("turns", "invalid_actions", "model_tokens"):
        expected = sum(t.metrics[key] for t in val_trajectories) / len(val_trajectories)
        assert val_line[f"val/rollout/{key}/mean"] == pytest.approx(expected)
    assert val_line["val/rollout/searches/mean"] == 0.0
    # and its reward components, as training logs them (the rubric's outcome, format and tool-use parts)
    for key in ("outcome", "format"):
        expected = sum(t.reward_components[key] for t in val_trajectories) / len(val_trajectories)
        assert val_line[f"val/reward_components/{key}"] == pytest.approx(expected)
    trained = trainer.parts.actor.model.state_dict()  # type: ignore[attr-defined]
    assert any(not torch.equal(trained[k], v) for k, v in start.items()), "two GRPO steps moved no weight"


def test_dapo_overlong_punishment_refuses_multi_turn_trajectories(
    tmp_path: Path, tokenizer: Any, replay_engine: Any, make_env: Any
) -> None:
    """DAPO's soft punishment measures a response against rollout.max_tokens, one turn's budget in an agent loop:
    a two-turn conversation (observations included) would be punished for being a conversation."""
    model_dir = tmp_path / "model"
    tiny_qwen2(tokenizer, seed=0).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    config = load_config(
        None,
        [
            f"model.path={model_dir}",
            f"trainer.output_dir={tmp_path / 'run'}",
            "data.train_batch_size=2",
            "rollout.n=2",
            "rollout.max_tokens=40",
            "algorithm.overlong_buffer=8",
            "trainer.total_steps=1",
            "trainer.save_every=0",
            "trainer.device=cpu",
            "trainer.trackers=[jsonl]",
        ],
    )
    collect = agent_collector(tokenizer, make_env, AgentLoopConfig(max_turns=3))(
        replay_engine(tokenizer, search_then_answer)
    )
    trainer = Trainer(
        config,
        engine=lambda module: HFEngine(module, tokenizer),
        collect=collect,
        reward_fn=env_reward,
        train_data=ROWS,
    )
    with pytest.raises(ValueError, match=r"algorithm.overlong=null for agent training"):
        trainer.fit()


def test_the_agent_collector_declares_its_template_variables() -> None:
    from rlloom.agent import AgentLoopConfig, SingleTurnEnv, agent_collector
    from rlloom.agent.rewards import AgentRubric
    from rlloom.core_rl.tiny import char_tokenizer

    config = AgentLoopConfig(chat_template_kwargs={"enable_thinking": False})
    factory = agent_collector(char_tokenizer(), lambda: SingleTurnEnv(AgentRubric(lambda r, g: 0.0)), config)
    assert factory.chat_template_kwargs == {"enable_thinking": False}  # type: ignore[attr-defined]
