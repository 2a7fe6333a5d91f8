"""The real HFEngine with the tiny Qwen2 model: sampled logprobs line up with a re-forward of the trajectory,
and a PPO training step puts exactly zero gradient on observation and template tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlloom.agent.envs.search import SEARCH_R1_INVALID_ACTION, SearchEnv, SearchEnvConfig
from rlloom.agent.envs.tool import ToolEnv
from rlloom.agent.loop import AgentLoop, AgentLoopConfig, to_batch
from rlloom.agent.rewards import AgentRubric
from rlloom.agent.tools import Toolset
from rlloom.core_rl.algorithms.logits import logprobs_from_logits
from rlloom.core_rl.algorithms.policy_loss import ppo_policy_loss
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine


def never(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
    return 0.0


def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: what to look up
    """
    raise KeyError(key)


@pytest.fixture(scope="module")
def model_and_engine(tokenizer: Any) -> Any:
    model = tiny_qwen2(tokenizer, seed=0)
    model.eval()
    engine = HFEngine(model, tokenizer)
    yield model, engine
    engine.close()


@pytest.fixture(scope="module")
def search_trajectories(tokenizer: Any, model_and_engine: Any, fixed_retriever: Any, hit: Any) -> list[Any]:
    _, engine = model_and_engine
    retriever = fixed_retriever([hit("1", 1.0, "Some passage text.", "T")])
    cfg = AgentLoopConfig(
        max_turns=3,
        max_tokens_per_turn=24,
        max_obs_tokens=40,
        max_total_tokens=1024,
        sampling=SamplingParams(temperature=1.0, seed=3),
    )
    loop = AgentLoop(engine, tokenizer, lambda: SearchEnv(retriever, AgentRubric(never), SearchEnvConfig()), cfg)
    return loop.run([{"question": "q one", "answer": "a"}, {"question": "q two", "answer": "b"}], n=2)


def test_random_policy_runs_to_max_turns_with_masked_corrections(
    search_trajectories: list[Any], tokenizer: Any
) -> None:
    marker = tokenizer.decode(tokenizer(" ...[truncated]")["input_ids"])
    for traj in search_trajectories:
        # a random character model neither searches nor answers: every turn is invalid
        assert traj.finish_reason in ("max_turns", "length")
        assert traj.metrics["invalid_actions"] == traj.metrics["turns"]
        masked = tokenizer.decode([t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if not m], False)
        # the corrective text is 60+ tokens, cut to 40 with the marker, and appears once per turn but the last
        cut = tokenizer.decode(
            tokenizer(SEARCH_R1_INVALID_ACTION)["input_ids"][: 40 - len(tokenizer(marker)["input_ids"])]
        )
        assert masked == (cut + marker) * (int(traj.metrics["turns"]) - 1)
        assert traj.metrics["obs_truncated"] == traj.metrics["turns"] - 1


def test_rollout_logprobs_match_a_forward_over_the_trajectory(
    search_trajectories: list[Any], model_and_engine: Any
) -> None:
    model, _ = model_and_engine
    for traj in search_trajectories:
        ids = torch.tensor([traj.prompt_ids + traj.response_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(traj.prompt_ids) - 1 : -1]
        lps = logprobs_from_logits(logits, torch.tensor(traj.response_ids))
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        rollout = torch.tensor(traj.rollout_logprobs)
        torch.testing.assert_close(rollout[mask], lps[mask], atol=2e-4, rtol=0)
        assert torch.all(rollout[~mask] == 0.0)


def test_training_step_gives_zero_gradient_to_observation_and_template_tokens(
    search_trajectories: list[Any], model_and_engine: Any, tokenizer: Any
) -> None:
    model, _ = model_and_engine
    batch = to_batch(search_trajectories, tokenizer)
    p = batch.prompt_width
    out = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    )
    logits = out.logits
    logits.retain_grad()
    resp_logits = logits[:, p - 1 : -1]
    logprobs = logprobs_from_logits(resp_logits, batch.responses)
    advantages = torch.linspace(-1.0, 1.0, batch.batch_size).unsqueeze(1).expand_as(logprobs) + 0.3
    loss, _ = ppo_policy_loss(
        logprobs, batch["rollout_logprobs"], advantages, batch.loss_mask.float(), clip_low=0.2, clip_high=0.2
    )
    model.zero_grad()
    loss.backward()
    grad = logits.grad[:, p - 1 : -1].abs().sum(-1)  # gradient on the logits that predict each response token
    obs_and_glue = (batch.loss_mask == 0) & (batch.response_attention_mask == 1)
    assert obs_and_glue.sum() > 0
    assert torch.all(grad[obs_and_glue] == 0.0)
    assert torch.all(grad[batch.loss_mask == 1] > 0.0)
    assert torch.all(logits.grad[:, : p - 1] == 0.0)  # prompt positions
    model.zero_grad()


def test_tool_env_with_real_engine_keeps_exact_tokens(tokenizer: Any, model_and_engine: Any) -> None:
    _, engine = model_and_engine
    cfg = AgentLoopConfig(max_turns=2, max_tokens_per_turn=16, sampling=SamplingParams(temperature=1.0, seed=1))
    loop = AgentLoop(engine, tokenizer, lambda: ToolEnv(Toolset([lookup]), AgentRubric(never)), cfg)
    trajs = loop.run([{"question": "look up x", "answer": "y"}], n=4)
    for traj in trajs:
        # a random model rarely closes its turn within 16 tokens: a cut last turn finishes 'length'
        last_turn_cut = traj.loss_mask[-1] == 1 and traj.response_ids[-1] not in engine.eos_token_ids
        assert traj.finish_reason in (("length",) if last_turn_cut else ("stop", "max_turns"))
        assert len(traj.response_ids) == len(traj.loss_mask) == len(traj.rollout_logprobs)
        assert sum(traj.loss_mask) == traj.metrics["model_tokens"]
        decoded = tokenizer.decode(traj.response_ids, skip_special_tokens=False)
        assert decoded == traj.response_text


def test_default_total_limit_stops_at_the_model_context(tokenizer: Any, fixed_retriever: Any, hit: Any) -> None:
    """AgentLoopConfig's default max_total_tokens (4096) on a model that takes 128 positions: conversations end
    with 'length' at 128 (the engine's context window) rather than failing the run with an over-long prompt."""
    engine = HFEngine(tiny_qwen2(tokenizer, max_position_embeddings=128, seed=1), tokenizer)
    retriever = fixed_retriever([hit("1", 1.0, "Some passage text.", "T")])
    env_cfg = SearchEnvConfig(template="Question: {question}\n")
    sampling = SamplingParams(temperature=1.0, seed=0, ignore_eos=True)  # every turn runs to its budget
    loop = AgentLoop(
        engine, tokenizer, lambda: SearchEnv(retriever, AgentRubric(never), env_cfg), AgentLoopConfig(sampling=sampling)
    )
    try:
        trajectories = loop.run([{"question": "q one", "answer": "a"}], n=2)
    finally:
        engine.close()
    assert [t.finish_reason for t in trajectories] == ["length", "length"]
    assert [len(t.prompt_ids) + len(t.response_ids) for t in trajectories] == [128, 128]


def test_a_rollout_pool_caps_conversations_at_its_replicas_context(
    tokenizer: Any, fixed_retriever: Any, hit: Any
) -> None:
    """The same limit through a `RolloutPool` of HFEngines: the pool passes the replicas' context window on, so
    conversations end 'length' at 128 tokens instead of the run failing on a prompt the replica refuses."""
    from rlloom.rollout.pool import RolloutPool

    model = tiny_qwen2(tokenizer, max_position_embeddings=128, seed=1)
    pool = RolloutPool(lambda: HFEngine(model, tokenizer), replicas=2, backend="thread")
    retriever = fixed_retriever([hit("1", 1.0, "Some passage text.", "T")])
    env_cfg = SearchEnvConfig(template="Question: {question}\n")
    sampling = SamplingParams(temperature=1.0, seed=0, ignore_eos=True)  # every turn runs to its budget
    loop = AgentLoop(
        pool, tokenizer, lambda: SearchEnv(retriever, AgentRubric(never), env_cfg), AgentLoopConfig(sampling=sampling)
    )
    try:
        trajectories = loop.run([{"question": "q one", "answer": "a"}], n=2)
    finally:
        pool.close()
    assert [t.finish_reason for t in trajectories] == ["length", "length"]
    assert [len(t.prompt_ids) + len(t.response_ids) for t in trajectories] == [128, 128]
