"""SearchEnv on a real rlloom-retrieval BM25 index (Search-R1's example corpus) with the default EM reward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlloom.agent.envs.search import SearchEnv
from rlloom.agent.loop import AgentLoop, AgentLoopConfig
from rlloom.retrieval import build_index, load_index

CORPUS = Path(__file__).parent / "data" / "search_r1_corpus.jsonl"


def test_bm25_search_then_em_reward(tmp_path: Path, tokenizer: Any, replay_engine: Any) -> None:
    retriever = load_index(build_index(CORPUS, tmp_path / "idx", "bm25"))
    top = retriever.search(["Horatio Hale ethnologist expedition"], 3)[0]
    assert top[0].title == "Horatio Hale"

    def script(context: str) -> str:
        if context.count("<information>") < 2:
            return "<think>who?</think>\n<search> Horatio Hale ethnologist expedition </search>"
        return "<answer> the United States Exploring Expedition </answer>"

    cfg = AgentLoopConfig(max_obs_tokens=None)  # char tokens: the 3 passages are ~1,800 tokens
    loop = AgentLoop(replay_engine(tokenizer, script), tokenizer, lambda: SearchEnv(retriever), cfg)
    golds = {"target": ["United States Exploring Expedition", "Wilkes Expedition"]}
    [traj] = loop.run([{"question": "Which expedition employed Horatio Hale", "reward_model": {"ground_truth": golds}}])
    text = tokenizer.decode(traj.response_ids, skip_special_tokens=False)
    # Search-R1 formatting: quoted title from the first line of `contents`, top-3, stripped, in <information>
    assert '</search>\n\n<information>Doc 1(Title: "Horatio Hale") consisted of an Algonkin vocabulary' in text
    assert text.count("Doc ") == len(top)  # the index returns only passages that match a query term
    assert traj.metrics["searches"] == 1
    assert traj.reward == pytest.approx(1.0)  # "the" is dropped by SQuAD normalisation
    assert traj.reward_components["outcome"] == 1.0
    assert traj.reward_components["outcome/f1"] == 1.0
