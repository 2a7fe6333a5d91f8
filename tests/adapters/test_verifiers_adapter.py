"""rlloom scorers as verifiers (0.4, `verifiers.v1`) reward functions, scored by verifiers' own `Task.score` on
real `vf.Trace`s, and rlloom.retrieval as a verifiers tool server, launched by verifiers' own launcher
(`python -m <module>` with the config as JSON, as a rollout does) and called through verifiers' harness-side MCP
client (`connect_mcp` / `call_mcp`, what its harnesses use to list and call a rollout's tools)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import verifiers.v1 as vf
from verifiers.v1.graph import MessageNode
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp
from verifiers.v1.mcp import serve
from verifiers.v1.types import AssistantMessage, UserMessage

from rlloom.retrieval import build_index, load_index
from rlloom.retrieval.verifiers_toolset import RetrievalToolset, RetrievalToolsetConfig, format_passages
from rlloom.rewards import Rubric
from rlloom.rewards.integrations.verifiers import vf_reward


class MathData(vf.TaskData):
    answer: str
    data_source: str = "gsm8k"


class MathTask(vf.Task[MathData]):
    accuracy = vf.reward(vf_reward("gsm8k"), weight=1.0)
    answer_format = vf.reward(vf_reward(Rubric([("em", "qa_em", 1.0)]), answer_field="answer"), weight=0.0)


def trace_of(task: vf.Task, reply: str) -> vf.Trace:
    return vf.Trace(
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        task=vf.TraceTask(type=type(task).__name__, data=task.data),
        nodes=[
            MessageNode(parent=None, message=UserMessage(content="2+2?"), sampled=False),
            MessageNode(parent=0, message=AssistantMessage(content=reply), sampled=True),
        ],
    )


async def scored(task: vf.Task, reply: str) -> vf.Trace:
    trace = trace_of(task, reply)
    await task.score(trace)
    return trace


def test_decorated_rlloom_rewards_scored_by_verifiers() -> None:
    task = MathTask(MathData(idx=0, prompt="2+2?", answer="4"))
    right = asyncio.run(scored(task, "2 + 2 = 4, so \\boxed{4}. <answer>4</answer>"))
    wrong = asyncio.run(scored(task, "\\boxed{5}"))
    # the attribute names key the rewards; weights as declared
    assert {k: (r.score, r.weight) for k, r in right.rewards.items()} == {
        "accuracy": (1.0, 1.0),
        "answer_format": (1.0, 0.0),
    }
    assert right.reward == 1.0
    assert wrong.rewards["accuracy"].score == 0.0 and wrong.reward == 0.0
    # the Rubric's components land as metrics, its extracted answer in trace.info
    assert right.metrics["answer_format/em"] == 1.0
    assert right.info["rlloom"]["accuracy"]["extracted"] == "4"


def test_plugged_by_import_path_routing_by_data_source(tmp_path: Path) -> None:
    config = vf.TaskConfig(
        rewards={
            "routed": vf.RewardFunctionConfig(fn="rlloom.rewards.integrations.verifiers:registry_reward", weight=2.0),
            "accuracy": vf.RewardFunctionConfig(weight=0.0),  # metadata-only override of the decorated method
        }
    )
    qa = MathTask(MathData(idx=1, prompt="capital?", answer="Paris", data_source="searchR1_nq"), config)
    trace = asyncio.run(scored(qa, "<think>...</think><answer>paris</answer>"))
    assert trace.rewards["routed"].score == 1.0 and trace.rewards["routed"].weight == 2.0
    assert trace.rewards["accuracy"].weight == 0.0
    # the QA scorer's components, as metrics under the adapter's own name (a plugged wrapper does not pass its name)
    assert trace.metrics["rlloom_registry/f1"] == 1.0


def test_a_missing_answer_field_fails_scoring_naming_the_field() -> None:
    class NoAnswer(vf.Task[vf.TaskData]):
        accuracy = vf.reward(vf_reward("gsm8k"))

    task = NoAnswer(vf.TaskData(idx=0, prompt="2+2?"))
    with pytest.raises(Exception, match="no 'answer' field") as info:
        asyncio.run(scored(task, "\\boxed{4}"))
    assert "answer_field=" in str(info.value) or "answer_field=" in str(info.value.__cause__)


CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "1", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"id": "2", "contents": '"Iliad"\nThe Iliad is an ancient Greek epic poem attributed to Homer.'},
    {"id": "3", "contents": '"Mount Everest"\nEverest is the highest mountain above sea level.'},
]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    return path


async def call_tool(config: RetrievalToolsetConfig, calls: list[dict[str, Any]]) -> tuple[list[dict], list[Any]]:
    toolset = RetrievalToolset(config)
    async with serve(toolset) as url, contextlib.AsyncExitStack() as stack:
        schemas, dispatch, servers = await connect_mcp({"mcpServers": {toolset.server_name: {"url": url}}}, stack)
        results = [await call_mcp(servers, dispatch, "retrieval_search", args) for args in calls]
    return schemas, results


def test_retrieval_tool_served_and_called_as_in_a_rollout(corpus: Path, tmp_path: Path) -> None:
    config = RetrievalToolsetConfig(corpus=str(corpus), top_k=2)
    calls = [{"query": "who wrote the iliad"}, {"query": "capital of france", "k": 1}, {"query": "x", "k": 99}]
    schemas, results = asyncio.run(call_tool(config, calls))
    (schema,) = schemas
    assert schema["function"]["name"] == "retrieval_search"
    assert schema["function"]["parameters"]["required"] == ["query"]
    assert "numbered" in schema["function"]["description"]
    # the same passages, in the same format, as rlloom's own BM25 index over the corpus gives
    expected = load_index(build_index(corpus, tmp_path / "idx", backend="bm25"))
    assert results[0] == format_passages(expected.search(["who wrote the iliad"], 2)[0])
    assert results[0].startswith('Doc 1(Title: "Iliad") The Iliad is an ancient Greek epic poem')
    assert results[1] == 'Doc 1(Title: "Paris") Paris is the capital and largest city of France.\n'
    assert results[2] == "Error: k must be between 1 and 10, got 99"


def test_retrieval_config_needs_exactly_one_source(corpus: Path) -> None:
    with pytest.raises(ValueError, match="exactly one of index, corpus or server_url"):
        RetrievalToolsetConfig()
    with pytest.raises(ValueError, match=r"\(given: index, corpus\)"):
        RetrievalToolsetConfig(index="idx", corpus=str(corpus))
    RetrievalToolsetConfig(url="http://127.0.0.1:9/mcp")  # an MCP server already running elsewhere
