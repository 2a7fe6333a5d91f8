"""AgentLoop's limits and failures: finish reasons of cut turns, the last turn's tools, the observation cap,
and errors that name the conversation instead of asyncio's ExceptionGroup."""

from __future__ import annotations

import asyncio
import json
import warnings
from typing import Any

import pytest

from rlloom.agent.environment import Observation, Prompt, Sample, StepResult
from rlloom.agent.envs.tool import ToolEnv
from rlloom.agent.loop import AgentLoop, AgentLoopConfig
from rlloom.agent.rewards import AgentRubric
from rlloom.agent.tools import Toolset

QUESTION = [{"question": "Q?", "answer": "5"}]
calls: list[int] = []


def big(n: int) -> str:
    """Return n characters.

    Args:
        n: how many
    """
    calls.append(n)
    return "x" * n


def zero(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
    return 0.0


def tool_call(n: int) -> str:
    return "<tool_call>" + json.dumps({"name": "big", "arguments": {"n": n}}) + "</tool_call>"


def run_tool_env(tokenizer: Any, replay_engine: Any, turns: list[str], **cfg: Any) -> Any:
    engine = replay_engine(tokenizer, lambda ctx: turns[min(ctx.count("<|im_start|>assistant") - 1, len(turns) - 1)])
    loop = AgentLoop(engine, tokenizer, lambda: ToolEnv(Toolset([big]), AgentRubric(zero)), AgentLoopConfig(**cfg))
    [traj] = loop.run(QUESTION)
    return traj, engine


def test_final_answer_cut_by_a_token_limit_finishes_length(tokenizer: Any, replay_engine: Any) -> None:
    """A turn without a tool call ends ToolEnv's episode (done); when the token limit cut it, 'length' wins."""
    by_total, engine = run_tool_env(tokenizer, replay_engine, ["A" * 5000], max_total_tokens=900)
    assert len(by_total.prompt_ids) + len(by_total.response_ids) == 900
    assert engine.requests[0].sampling.max_tokens == 900 - len(by_total.prompt_ids)  # the total, not the turn cap
    assert by_total.finish_reason == "length"

    by_turn_cap, _ = run_tool_env(tokenizer, replay_engine, ["A" * 600], max_tokens_per_turn=100)
    assert len(by_turn_cap.response_ids) == 100
    assert by_turn_cap.finish_reason == "length"

    whole, _ = run_tool_env(tokenizer, replay_engine, ["A" * 50], max_tokens_per_turn=100)
    assert whole.finish_reason == "stop"  # sampled EOS within the limits: the env's done stands


def test_last_allowed_turn_runs_no_tools_and_counts_them(tokenizer: Any, replay_engine: Any) -> None:
    calls.clear()
    traj, _ = run_tool_env(tokenizer, replay_engine, [tool_call(3)], max_turns=3, max_total_tokens=8000)
    assert traj.finish_reason == "max_turns"
    assert calls == [3, 3]  # turns 1 and 2; the third turn's result could never be shown
    assert traj.metrics["tool_calls"] == 2
    assert traj.metrics["tool_calls_skipped"] == 1
    assert traj.response_text.endswith(tool_call(3) + "<|im_end|>")


def test_last_turn_cut_at_max_turns_finishes_length(tokenizer: Any, replay_engine: Any) -> None:
    traj, _ = run_tool_env(tokenizer, replay_engine, [tool_call(3) + "B" * 300], max_turns=2, max_tokens_per_turn=80)
    assert traj.metrics["turns"] == 2
    assert traj.finish_reason == "length"


def test_max_obs_tokens_caps_the_whole_observation(tokenizer: Any, replay_engine: Any) -> None:
    """Four 300-token tool results under max_obs_tokens=50: 50 content tokens in all, shared 13/13/12/12."""
    turns = [tool_call(300) * 4, "done"]
    traj, _ = run_tool_env(tokenizer, replay_engine, turns, max_obs_tokens=50, max_total_tokens=8000)
    text = traj.response_text
    contents = [chunk.split("<|im_end|>")[0] for chunk in text.split("<|im_start|>tool\n")[1:]]
    marker = " ...[truncated]"  # 15 tokens with the char tokenizer, longer than a share: its start is kept
    assert contents == [marker[:13], marker[:13], marker[:12], marker[:12]]
    assert sum(len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in contents) == 50

    short_and_long = [tool_call(5) + tool_call(300), "done"]
    traj, _ = run_tool_env(tokenizer, replay_engine, short_and_long, max_obs_tokens=50, max_total_tokens=8000)
    contents = [chunk.split("<|im_end|>")[0] for chunk in traj.response_text.split("<|im_start|>tool\n")[1:]]
    assert contents == ["xxxxx", "x" * (45 - len(marker)) + marker]  # the short one whole, the long one the rest
    assert traj.metrics["obs_truncated"] == 1


class RaisingEnv(ToolEnv):
    async def step(self, action: str, *, last_turn: bool = False) -> StepResult:
        raise KeyError("env bug")


def test_a_failing_conversation_raises_its_own_error(tokenizer: Any, replay_engine: Any) -> None:
    engine = replay_engine(tokenizer, lambda ctx: "hi")
    loop = AgentLoop(engine, tokenizer, lambda: RaisingEnv(Toolset([big]), AgentRubric(zero)))
    with pytest.raises(KeyError, match="env bug") as info:
        loop.run([{"question": "first"}, {"question": "second"}])
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "AgentLoop: 2 conversations failed; this is the first" in notes
    assert "question 'first'" in notes or "question 'second'" in notes


def test_prompt_too_long_names_the_sample_and_the_fix(tokenizer: Any, replay_engine: Any) -> None:
    engine = replay_engine(tokenizer, lambda ctx: "hi")
    env = lambda: ToolEnv(Toolset([big]), AgentRubric(zero))  # noqa: E731
    loop = AgentLoop(engine, tokenizer, env, AgentLoopConfig(max_total_tokens=100))
    with pytest.raises(ValueError, match=r"question 'what is 2\+3\?': the prompt has \d+ tokens") as info:
        loop.run([{"question": "what is 2+3?"}])
    assert "raise max_total_tokens" in str(info.value)
    assert "sample 0" in "\n".join(info.value.__notes__)


def test_a_failing_templated_prompt_is_named_by_its_question_and_row(tokenizer: Any, replay_engine: Any) -> None:
    # Search-R1/veRL prompts share a long instruction head: the note must show the question at the end and the
    # row's index, or every failing row reads the same
    engine = replay_engine(tokenizer, lambda ctx: "hi")
    env = lambda: ToolEnv(Toolset([big]), AgentRubric(zero))  # noqa: E731
    loop = AgentLoop(engine, tokenizer, env, AgentLoopConfig(max_total_tokens=100))
    head = "Answer the given question. You must conduct reasoning inside <think> first. " * 3
    row = {"prompt": [{"role": "user", "content": head + "Question: who wrote hamlet?"}], "answer": "x",
           "data_source": "nq", "extra_info": {"index": 17}}  # fmt: skip
    with pytest.raises(ValueError, match="the prompt has") as info:
        loop.run([row])
    assert "Question: who wrote hamlet?' (nq row index 17)" in str(info.value)


def test_run_inside_an_event_loop_says_to_await_arun(tokenizer: Any, replay_engine: Any) -> None:
    engine = replay_engine(tokenizer, lambda ctx: "hi")
    loop = AgentLoop(engine, tokenizer, lambda: ToolEnv(Toolset([big]), AgentRubric(zero)))

    async def inside() -> None:
        loop.run([{"question": "q"}])

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a "coroutine was never awaited" warning would fail here
        with pytest.raises(RuntimeError, match=r"await loop\.arun"):
            asyncio.run(inside())
    [traj] = asyncio.run(loop.arun([{"question": "q"}]))
    assert traj.finish_reason == "stop"


class ContinuingEnv:
    """A text-continuation env that answers every turn with a text observation or nothing (no chat turns)."""

    def __init__(self, kinds: list[str]) -> None:
        self.kinds = kinds
        self.turn = 0

    @property
    def stop(self) -> list[str]:
        return []

    def reset(self, sample: Sample) -> Prompt:
        return Prompt(text="Q: go\n")

    async def step(self, action: str) -> StepResult:  # the signature before `last_turn` existed
        kind = self.kinds[self.turn]
        self.turn += 1
        if kind == "done":
            return StepResult(None, True)
        return StepResult(Observation(text="[obs]") if kind == "text" else None, False)

    async def reward(self, trajectory: Any) -> Any:
        raise NotImplementedError


def test_continuing_text_envs_drop_the_eos_between_turns(tokenizer: Any, replay_engine: Any) -> None:
    """Text observations and no observation continue the same message: a sampled EOS there is removed (ids,
    mask, logprobs and the next prompt); the final turn keeps its EOS. ToolEnv keeps its <|im_end|> (tested in
    test_tool_loop.py against the chat template)."""
    engine = replay_engine(tokenizer, lambda ctx: "ab")
    loop = AgentLoop(
        engine, tokenizer, lambda: ContinuingEnv(["text", "none", "done"]), AgentLoopConfig(compute_reward=False)
    )
    [traj] = loop.run([{"question": "go"}])
    eos = tokenizer.eos_token
    assert traj.response_text == "ab[obs]abab" + eos
    assert traj.loss_mask == [1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert traj.rollout_logprobs == pytest.approx([-0.01, -0.02, 0, 0, 0, 0, 0, -0.02, -0.03, -0.03, -0.04, -0.05])
    assert tokenizer.decode(engine.requests[2].prompt_ids, skip_special_tokens=False) == "Q: go\nab[obs]ab"
    assert traj.metrics["model_tokens"] == 7


def test_an_engine_that_returns_no_token_ids_is_refused(tokenizer: Any, replay_engine: Any) -> None:
    """A hosted OpenAI API gives text but no `token_ids` (OpenAIEngine then returns []): the loop used to build a
    trajectory without a single model token (loss_mask all 0) whose later turns never saw the earlier ones."""
    import dataclasses

    class TextOnly(replay_engine):  # type: ignore[misc,valid-type]
        async def agenerate(self, request: Any) -> Any:
            return [dataclasses.replace(c, token_ids=[], logprobs=None) for c in await super().agenerate(request)]

    engine = TextOnly(tokenizer, lambda ctx: tool_call(3))
    loop = AgentLoop(engine, tokenizer, lambda: ToolEnv(Toolset([big]), AgentRubric(zero)))
    tools_before = len(calls)
    with pytest.raises(ValueError, match="no token ids .*`rlloom-rollout serve`"):
        loop.run(QUESTION)
    assert engine.calls == 1 and len(calls) == tools_before  # refused at the first turn, before its tool call ran


class CancellingEnv(ToolEnv):
    async def step(self, action: str, *, last_turn: bool = False) -> StepResult:
        raise asyncio.CancelledError()  # e.g. a retriever client whose request was cancelled under it


def test_a_conversation_cancelled_from_inside_is_an_error_not_a_missing_trajectory(
    tokenizer: Any, replay_engine: Any
) -> None:
    """n conversations per sample must come back, or the run must fail: a silently missing one shrinks a GRPO
    group and shifts every later sample's trajectories."""
    engine = replay_engine(tokenizer, lambda ctx: "hi")
    loop = AgentLoop(engine, tokenizer, lambda: CancellingEnv(Toolset([big]), AgentRubric(zero)))
    with pytest.raises(RuntimeError, match="was cancelled from inside") as info:
        loop.run([{"question": "first"}], n=2)
    assert "question 'first'" in "\n".join(info.value.__notes__)
