"""`search.format_reward:` trains on Search-R1 v0.3's `qa_em_format` reward.

Expected scores are worked by hand from Search-R1's verl/utils/reward_score/qa_em_format.py
(github.com/PeterGriffinJin/Search-R1) `compute_score_em` with the v0.3 launch scripts' scores
(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0):
  correct answer, valid sequence -> 1; correct, invalid -> 1 - 0.2 = 0.8; wrong, valid -> 0.2 (+ retrieval_score
  when a gold alias is inside an <information> block); wrong, invalid -> 0.1; no answer, invalid -> 0.
A valid sequence is think -> (search -> information -> think)* -> answer with only whitespace between blocks.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from rlloom_apps.search_agent.cli import main
from rlloom_apps.search_agent.data import prepare
from rlloom_apps.search_agent.format_reward import FormatRewardSearchEnv, FormatRewardSettings, score_transcript
from rlloom_apps.search_agent.settings import load_train_config
from rlloom_apps.search_agent.train import CONFIGS

from rlloom.agent import Sample
from rlloom.agent.envs.search import SEARCH_R1_INVALID_ACTION
from rlloom.core_rl.tiny import save_tiny_model
from rlloom.retrieval import Hit, build_index

GOLD = {"target": ["Paris"]}
INFO = '\n\n<information>Doc 1(Title: "Paris") Paris is the capital of France.</information>\n\n'
VALID_SEARCH = (
    f"<think> I need to look it up. </think>\n<search> capital of france </search>{INFO}<think> found it </think>\n"
)
PUBLISHED = FormatRewardSettings()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"{VALID_SEARCH}<answer> Paris </answer>", 1.0),  # correct, valid
        ("<think> easy </think>\n<answer> paris. </answer>", 1.0),  # normalised EM, no search needed
        ("Sure! <think> easy </think><answer> Paris </answer>", 0.8),  # text outside tags: invalid
        ("<answer> Paris </answer>", 0.8),  # no <think> before the answer: invalid
        (f"{VALID_SEARCH}<answer> Lyon </answer>", 0.2),  # wrong, valid (retrieval_score 0)
        ("<think> hm </think><answer> Lyon </answer> and more", 0.1),  # wrong, invalid
        ("<think> hm </think><search> x </search><think> y </think><answer> Lyon", 0.0),  # no answer, invalid
        (f"blah{SEARCH_R1_INVALID_ACTION}blah", 0.1),  # the corrective text's "<answer> and </answer>" is wrong
    ],
)
def test_published_scores_on_hand_worked_cases(text: str, expected: float) -> None:
    assert score_transcript(text, GOLD, PUBLISHED).score == pytest.approx(expected)


def test_retrieval_score_is_added_to_a_valid_wrong_answer_that_retrieved_the_gold() -> None:
    settings = FormatRewardSettings(retrieval_score=0.1)
    assert score_transcript(f"{VALID_SEARCH}<answer> Lyon </answer>", GOLD, settings).score == pytest.approx(0.3)
    wrong_docs = VALID_SEARCH.replace("Paris is the capital of France", "Lyon is a city").replace('"Paris"', '"Lyon"')
    assert score_transcript(f"{wrong_docs}<answer> Rome </answer>", GOLD, settings).score == pytest.approx(0.2)


class OnePassage:
    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return [[Hit(doc_id="0", score=1.0, title="Paris", text="Paris is the capital of France.")] for _ in queries]


def test_env_scores_the_turns_with_the_information_between_them() -> None:
    env = FormatRewardSearchEnv(OnePassage(), None, format_reward=PUBLISHED)
    env.reset(Sample(question="what is the capital of france", ground_truth=GOLD))

    async def play() -> Any:
        first = await env.step("<think> I need to look it up. </think>\n<search> capital of france </search>")
        assert first.observation is not None and "<information>" in first.observation.before
        await env.step("<think> found it </think>\n<answer> Paris </answer>")
        return await env.reward(None)  # type: ignore[arg-type]

    reward = asyncio.run(play())
    # the model's turns alone (what plain SearchEnv scores) are not a valid sequence: </search> then <think>
    assert score_transcript("".join(env._actions), GOLD, PUBLISHED).score == pytest.approx(0.8)
    assert reward.score == pytest.approx(1.0)
    assert reward.components == {"em": 1.0, "format_valid": 1.0}


def test_config_section_selects_it_and_rejects_unknown_keys() -> None:
    _, search = load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m", "search.format_reward={}"])
    assert search.format_reward == PUBLISHED
    _, plain = load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m"])
    assert plain.format_reward is None
    with pytest.raises((ValidationError, ValueError), match="structure_score"):
        load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m", "search.format_reward={structure_score: 0.3}"])


@pytest.mark.slow
def test_tiny_run_trains_on_the_format_reward(tmp_path: Path) -> None:
    """`search.format_reward={}` reaches the rollouts: the logged reward parts are the format reward's."""
    passages = [("Paris", "Paris is the capital of France."), ("Berlin", "Berlin is the capital of Germany.")]
    (tmp_path / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": str(i), "title": t, "text": x}) + "\n" for i, (t, x) in enumerate(passages))
    )
    index = build_index(tmp_path / "corpus.jsonl", tmp_path / "index", "bm25")
    questions = [{"question": "what is the capital of france", "answer": ["Paris"]}]
    (tmp_path / "nq.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions * 2))
    prepare("nq", tmp_path / "nq.jsonl", tmp_path / "train.jsonl", split="train")
    save_tiny_model(tmp_path, max_position_embeddings=2048)
    out = tmp_path / "run"
    main(
        [
            "train", "--config", "grpo", "--train-data", str(tmp_path / "train.jsonl"), "--index", str(index),
            f"model.path={tmp_path / 'model'}", f"model.tokenizer_path={tmp_path / 'tokenizer'}",
            "model.dtype=float32", "model.gradient_checkpointing=false", "data.train_batch_size=2", "rollout.n=2",
            "rollout.max_tokens=8", "actor.mini_batch_size=2", "actor.warmup_steps=0", "trainer.total_steps=1",
            "trainer.save_every=0", "trainer.val_before_train=false", "trainer.device=cpu",
            "trainer.trackers=[jsonl]", f"trainer.output_dir={out}", "search.max_turns=2",
            "search.max_obs_tokens=32", "search.max_total_tokens=2048", "search.format_reward={}",
        ]
    )  # fmt: skip
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(line for line in steps if "reward/mean" in line)
    # a random model writes no action, so each turn but the last gets Search-R1's corrective text, which holds
    # "<answer> and </answer>": Search-R1 reads that as a wrong answer in an invalid sequence too, 0.1 every time
    assert step["reward/mean"] == pytest.approx(0.1) and step["reward/std"] == 0.0
    assert step["reward_components/em"] == 0.0 and step["reward_components/format_valid"] == 0.0
    assert "reward_components/outcome" not in step
