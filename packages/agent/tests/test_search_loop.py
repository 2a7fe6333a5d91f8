"""SearchEnv through AgentLoop with a scripted policy: exact tokens, masks, logprobs, limits."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from rlloom.agent.environment import Sample
from rlloom.agent.envs.search import SEARCH_R1_INVALID_ACTION, SEARCH_R1_TEMPLATE, SearchEnv, SearchEnvConfig
from rlloom.agent.loop import AgentLoop, AgentLoopConfig
from rlloom.agent.rewards import AgentRubric

HITS = [
    ("7", 2.0, "Paris is the capital of France.", "Paris"),
    ("9", 1.5, "France is in Europe.", "France"),
    ("3", 1.0, "Unused third passage.", "Other"),
]


@pytest.fixture
def retriever(fixed_retriever: Any, hit: Any) -> Any:
    return fixed_retriever([hit(*h) for h in HITS])


@pytest.fixture
def make_loop(tokenizer: Any, replay_engine: Any) -> Any:
    def build(script: Any, retriever: Any, **cfg: Any) -> tuple[AgentLoop, Any]:
        engine = replay_engine(tokenizer, script)
        env_cfg = SearchEnvConfig(top_k=2)
        loop = AgentLoop(
            engine,
            tokenizer,
            lambda: SearchEnv(retriever, AgentRubric(contains_gold, format_weight=0.5), env_cfg),
            AgentLoopConfig(**cfg),
        )
        return loop, engine

    return build


def contains_gold(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
    """Test scorer: 1 when the last <answer> equals the gold string."""
    found = re.findall(r"<answer>(.*?)</answer>", response, re.DOTALL)
    return float(bool(found) and found[-1].strip() == ground_truth)


def search_script(context: str) -> str:
    """Turn 1 searches (and rambles past the stop string), turn 2 answers."""
    if context.count("<information>") < 2:  # the prompt itself mentions the tag once
        return "<think>need facts</think>\n<search> capital of France </search> junk after stop"
    return "<think>found it</think>\n<answer> Paris </answer> trailing text never sampled"


def test_search_trajectory_is_the_exact_conversation(tokenizer: Any, make_loop: Any, retriever: Any) -> None:
    loop, engine = make_loop(search_script, retriever)
    [traj] = loop.run([{"question": "what is the capital of France", "golden_answers": "Paris"}])

    question = "what is the capital of France?"  # Search-R1 appends the question mark
    prompt = f"<|im_start|>user\n{SEARCH_R1_TEMPLATE.format(question=question)}<|im_end|>\n<|im_start|>assistant\n"
    turn1 = "<think>need facts</think>\n<search> capital of France </search>"
    info = (
        '\n\n<information>Doc 1(Title: "Paris") Paris is the capital of France.\n'
        'Doc 2(Title: "France") France is in Europe.</information>\n\n'
    )
    turn2 = "<think>found it</think>\n<answer> Paris </answer>"
    assert tokenizer.decode(traj.prompt_ids, skip_special_tokens=False) == prompt
    assert tokenizer.decode(traj.response_ids, skip_special_tokens=False) == turn1 + info + turn2
    assert retriever.queries == ["capital of France"]

    # loss mask: exactly the two sampled turns
    sampled = [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m == 1]
    context = [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m == 0]
    assert tokenizer.decode(sampled) == turn1 + turn2
    assert tokenizer.decode(context) == info
    n1 = len(tokenizer(turn1)["input_ids"])
    assert traj.loss_mask == [1] * n1 + [0] * len(tokenizer(info)["input_ids"]) + [1] * (len(sampled) - n1)

    # logprobs: the engine's values at sampled positions, 0.0 elsewhere
    assert traj.rollout_logprobs is not None
    engine_lps = [-0.01 * (1 + k) for k in range(n1)] + [-0.01 * (2 + k) for k in range(len(sampled) - n1)]
    assert [lp for lp, m in zip(traj.rollout_logprobs, traj.loss_mask, strict=True) if m] == pytest.approx(engine_lps)
    assert all(lp == 0.0 for lp, m in zip(traj.rollout_logprobs, traj.loss_mask, strict=True) if not m)

    # the second request's prompt is the first context plus everything so far, as ids
    assert (
        engine.requests[1].prompt_ids == traj.prompt_ids + traj.response_ids[: n1 + len(tokenizer(info)["input_ids"])]
    )
    assert engine.requests[0].sampling.stop == ["</search>", "</answer>"]

    assert traj.finish_reason == "stop"
    assert traj.metrics["turns"] == 2
    assert traj.metrics["searches"] == 1
    assert traj.metrics["answers"] == 1
    assert traj.reward == pytest.approx(1.5)  # outcome 1 + 0.5 x format 1
    assert traj.reward_components == {"outcome": 1.0, "format": 1.0, "tool_use": 0.0}
    assert traj.ground_truth == "Paris"


def test_invalid_action_gets_search_r1_correction(tokenizer: Any, make_loop: Any, retriever: Any) -> None:
    def script(context: str) -> str:
        return "<answer> Lyon </answer>" if "invalid" in context else "I think it is Lyon."

    loop, engine = make_loop(script, retriever)
    [traj] = loop.run([{"question": "capital?", "answer": "Paris"}])
    text = tokenizer.decode(traj.response_ids, skip_special_tokens=False)
    # the first turn ended with a sampled EOS; the correction continues the same assistant message, so that EOS
    # is dropped (Search-R1 re-tokenises without special tokens): never trained on, never in the next prompt
    assert text == "I think it is Lyon." + SEARCH_R1_INVALID_ACTION + "<answer> Lyon </answer>"
    first = len(tokenizer("I think it is Lyon.")["input_ids"])
    n_obs = len(tokenizer(SEARCH_R1_INVALID_ACTION)["input_ids"])
    assert traj.loss_mask == [1] * first + [0] * n_obs + [1] * (len(traj.loss_mask) - first - n_obs)
    assert traj.rollout_logprobs is not None
    assert traj.rollout_logprobs[:first] == pytest.approx([-0.01 * (1 + k) for k in range(first)])
    second = tokenizer.decode(engine.requests[1].prompt_ids, skip_special_tokens=False)
    assert second == traj.prompt_text + "I think it is Lyon." + SEARCH_R1_INVALID_ACTION
    assert traj.metrics["model_tokens"] == sum(traj.loss_mask)
    assert traj.metrics["invalid_actions"] == 1
    assert traj.reward_components["outcome"] == 0.0
    assert traj.reward_components["format"] == pytest.approx(1.0)


def test_observation_truncated_with_marker_keeps_closing_tag(
    tokenizer: Any, make_loop: Any, fixed_retriever: Any, hit: Any
) -> None:
    long_hit = fixed_retriever([hit("1", 1.0, "x" * 400, "T")])
    loop, _ = make_loop(search_script, long_hit, max_obs_tokens=50, truncation_marker="[cut]")
    [traj] = loop.run([{"question": "q?", "answer": "Paris"}])
    text = tokenizer.decode(traj.response_ids, skip_special_tokens=False)
    body = 'Doc 1(Title: "T") ' + "x" * 400
    assert "\n\n<information>" + body[:45] + "[cut]</information>\n\n" in text
    assert traj.metrics["obs_truncated"] == 1
    assert traj.finish_reason == "stop"


def test_max_turns_ends_a_conversation_that_never_answers(tokenizer: Any, make_loop: Any, retriever: Any) -> None:
    def script(context: str) -> str:
        return f"<search> query {context.count('<information>') - 1} </search>"

    loop, engine = make_loop(script, retriever, max_turns=3)
    [traj] = loop.run([{"question": "q?", "answer": "Paris"}])
    assert traj.finish_reason == "max_turns"
    assert traj.metrics["turns"] == 3
    assert engine.calls == 3
    # the env saw the last turn's action but did not search (nothing can follow the last turn), as Search-R1
    assert tokenizer.decode(traj.response_ids, skip_special_tokens=False).endswith("<search> query 2 </search>")
    assert retriever.queries == ["query 0", "query 1"]
    assert (traj.metrics["searches"], traj.metrics["searches_skipped"]) == (2, 1)
    assert traj.reward_components["format"] == 0.0  # never answered


def test_total_length_limit_gives_finish_length(tokenizer: Any, make_loop: Any, retriever: Any) -> None:
    def script(context: str) -> str:
        return "<search> q </search>"

    loop, _ = make_loop(script, retriever, max_total_tokens=900, max_turns=50)
    [traj] = loop.run([{"question": "q?", "answer": "Paris"}])
    assert traj.finish_reason == "length"
    assert len(traj.prompt_ids) + len(traj.response_ids) == 900
    assert len(traj.response_ids) == len(traj.loss_mask) == len(traj.rollout_logprobs or [])


def test_engine_context_window_caps_the_conversation(tokenizer: Any, replay_engine: Any, retriever: Any) -> None:
    """A loop limit above the model's context is capped by it: the conversation ends with 'length' at the window
    instead of sending the engine a prompt it must refuse (which would fail the whole run)."""
    engine = replay_engine(tokenizer, lambda context: "<search> q </search>")
    engine.context_window = 600
    env_cfg = SearchEnvConfig(top_k=2)
    rubric = AgentRubric(contains_gold)
    loop = AgentLoop(engine, tokenizer, lambda: SearchEnv(retriever, rubric, env_cfg), AgentLoopConfig(max_turns=50))
    assert loop.config.max_total_tokens == 4096 and loop.max_total_tokens == 600
    [traj] = loop.run([{"question": "q?", "answer": "Paris"}])
    assert traj.finish_reason == "length"
    assert len(traj.prompt_ids) + len(traj.response_ids) == 600
    assert max(len(r.prompt_ids or []) for r in engine.requests) < 600


def test_per_turn_cut_by_total_budget_is_length(tokenizer: Any, make_loop: Any, retriever: Any) -> None:
    def script(context: str) -> str:
        return "<think>" + "z" * 1000 + "</think>"

    loop, _ = make_loop(script, retriever, max_total_tokens=700, max_tokens_per_turn=500)
    [traj] = loop.run([{"question": "q?", "answer": "Paris"}])
    # first turn: 500 tokens (per-turn cap, not the total) -> invalid action observation; then the total cuts
    assert traj.finish_reason == "length"
    assert len(traj.prompt_ids) + len(traj.response_ids) == 700
    assert traj.metrics["invalid_actions"] >= 1


def test_groups_share_ids_and_results_follow_sample_order(tokenizer: Any, make_loop: Any, retriever: Any) -> None:
    loop, _ = make_loop(search_script, retriever)
    rows = [{"question": f"q{i}?", "answer": "Paris", "data_source": f"src{i}"} for i in range(3)]
    trajs = loop.run(rows, n=2)
    assert [t.data_source for t in trajs] == ["src0", "src0", "src1", "src1", "src2", "src2"]
    assert trajs[0].group_id == trajs[1].group_id != trajs[2].group_id
    assert "q1?" in trajs[2].prompt_text


def test_a_vllm_style_sampling_config_still_shows_the_env_its_stop_string(
    tokenizer: Any, make_loop: Any, retriever: Any
) -> None:
    """vLLM's default `include_stop_str_in_output=False`, copied into the loop's sampling, must not hide the
    `</search>` the trajectory holds from the env (every search was an invalid action)."""
    from rlloom.core_rl.contracts.generation import SamplingParams

    loop, engine = make_loop(search_script, retriever, sampling=SamplingParams(include_stop_str_in_output=False))
    [traj] = loop.run([{"question": "what is the capital of France", "golden_answers": "Paris"}])
    assert traj.metrics["searches"] == 1 and traj.metrics["invalid_actions"] == 0
    assert traj.finish_reason == "stop" and traj.reward_components["outcome"] == 1.0
    assert all(r.sampling.include_stop_str_in_output for r in engine.requests)


def test_an_http_engine_names_the_models_other_eos_ids_for_the_loop(tokenizer: Any, retriever: Any) -> None:
    """Over HTTP the server cannot say which ids end a turn (a Qwen instruct model's <|endoftext|> besides its
    tokenizer's <|im_end|>): OpenAIEngineConfig.eos_token_ids tells the loop, which drops such a trailing id."""
    from rlloom.rollout.openai.engine import OpenAIEngine, OpenAIEngineConfig

    other = int(tokenizer.pad_token_id)
    assert other != tokenizer.eos_token_id
    engine = OpenAIEngine(
        OpenAIEngineConfig(base_url="http://127.0.0.1:9/v1", model="m", context_window=None, eos_token_ids=[other])
    )
    loop = AgentLoop(engine, tokenizer, lambda: SearchEnv(retriever, AgentRubric(contains_gold), SearchEnvConfig()))
    assert loop.template.eos_token_ids == {other, tokenizer.eos_token_id}
    plain = OpenAIEngine(OpenAIEngineConfig(base_url="http://127.0.0.1:9/v1", model="m", context_window=None))
    assert AgentLoop(
        plain, tokenizer, lambda: SearchEnv(retriever, AgentRubric(contains_gold))
    ).template.eos_token_ids == {tokenizer.eos_token_id}


class _HangingRetriever:
    """An async retriever that never answers (a stalled search server)."""

    async def asearch(self, queries: list[str], k: int) -> list[list[Any]]:
        await asyncio.sleep(3600)
        return [[] for _ in queries]


def test_a_search_timeout_tells_the_model_how_long_it_waited() -> None:
    """Not `Search failed: TimeoutError: ` with nothing after it: wait_for's timeout has an empty message."""
    env = SearchEnv(_HangingRetriever(), config=SearchEnvConfig(search_timeout_s=0.05))
    env.reset(Sample.from_row({"question": "q", "golden_answers": ["a"]}))
    result = asyncio.run(env.step("<search> q </search>"))
    assert result.observation is not None
    assert result.observation.text == "Search failed: no results within 0.05 s"
    assert (result.info["searches"], result.info["search_errors"]) == (1.0, 1.0)
