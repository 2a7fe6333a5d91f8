"""Observations are never the model's answer (issue 41): a passage or the environment's invalid-action hint that
holds `<answer>gold</answer>` earns nothing when the model itself never answers; the honest twin, where the
model writes the same answer, scores 1. Run through `AgentLoop` with a scripted policy and `SearchEnv`'s default
rubric (rlloom-rewards' `qa_em_scorer`), so the text the reward reads is the text the loop recorded."""

from __future__ import annotations

from typing import Any

import pytest

from rlloom.agent.envs.search import SEARCH_R1_INVALID_ACTION, SearchEnv, SearchEnvConfig
from rlloom.agent.loop import AgentLoop, AgentLoopConfig
from rlloom.agent.rewards import AgentRubric
from rlloom.rewards.qa import qa_em_scorer

ROW = {"question": "what is the capital of France", "golden_answers": ["Paris"]}
LEAKY = "A quiz key. <answer> Paris </answer>"  # a retrieved passage that holds the gold inside answer tags


def run(tokenizer: Any, replay_engine: Any, retriever: Any, script: Any, **env: Any) -> Any:
    config = SearchEnvConfig(top_k=1, **env)
    loop = AgentLoop(
        replay_engine(tokenizer, script),
        tokenizer,
        lambda: SearchEnv(retriever, AgentRubric(qa_em_scorer, format_weight=0.5), config),
        AgentLoopConfig(max_turns=2),
    )
    [traj] = loop.run([ROW])
    return traj


def searches_then(last_turn: str) -> Any:
    return lambda context: last_turn if "A quiz key" in context else "<think>look</think>\n<search> capital </search>"


@pytest.mark.parametrize("answers", [False, True])
def test_a_retrieved_answer_tag_is_not_the_models_answer(
    tokenizer: Any, replay_engine: Any, fixed_retriever: Any, hit: Any, answers: bool
) -> None:
    last_turn = "<think>the passage says it</think>" + ("\n<answer> Paris </answer>" if answers else "")
    em = float(answers)
    retriever = fixed_retriever([hit("1", 1.0, LEAKY, "Quiz")])
    traj = run(tokenizer, replay_engine, retriever, searches_then(last_turn))
    conversation = tokenizer.decode(traj.response_ids, skip_special_tokens=False)
    assert "<answer> Paris </answer>" in conversation  # the passage is in the conversation the model saw
    assert traj.reward_components["outcome"] == em
    assert traj.reward_components.get("outcome/f1", 0.0) == em
    assert traj.reward_components["format"] == em  # an episode that never answers has no format credit
    assert traj.reward == pytest.approx(1.5 * em)


@pytest.mark.parametrize(("answers", "em"), [(False, 0.0), (True, 1.0)])
def test_the_invalid_action_hint_is_not_the_models_answer(
    tokenizer: Any, replay_engine: Any, fixed_retriever: Any, answers: bool, em: float
) -> None:
    hint = SEARCH_R1_INVALID_ACTION.replace("</answer>.", "</answer>, e.g. <answer> Paris </answer>.")

    def script(context: str) -> str:
        return "<answer> Paris </answer>" if answers and "Let me try again" in context else "I am not sure."

    traj = run(tokenizer, replay_engine, fixed_retriever([]), script, invalid_action_text=hint)
    assert traj.metrics["invalid_actions"] >= 1
    assert "<answer> Paris </answer>" in tokenizer.decode(traj.response_ids, skip_special_tokens=False)
    assert traj.reward_components["outcome"] == em
    assert traj.reward == pytest.approx(em + 0.5 * traj.reward_components["format"])
    # plain prose has balanced tags, so each turn parses; an episode that never answers still gets no credit
    assert traj.reward_components["format"] == (1.0 if answers else 0.0)
