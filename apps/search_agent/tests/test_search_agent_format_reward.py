"""`search.format_reward:` trains on Search-R1 v0.3's `qa_em_format` reward, read per segment (issue 41).

Expected scores are worked by hand from Search-R1's verl/utils/reward_score/qa_em_format.py
(github.com/PeterGriffinJin/Search-R1) `compute_score_em` with the v0.3 launch scripts' scores
(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0):
  correct answer, valid sequence -> 1; correct, invalid -> 1 - 0.2 = 0.8; wrong, valid -> 0.2 (+ retrieval_score
  when a gold alias is inside an <information> block); wrong, invalid -> 0.1; no answer, invalid -> 0.
A valid sequence is think -> (search -> information -> think)* -> answer with only whitespace between blocks.
Where the model's turns and passages hold no stray tags and no turn was corrected, the result equals Search-R1's
reading of the whole text (rlloom-rewards' `search_r1_format_reward`); where an observation holds an answer tag,
only the model's own answer counts.
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
from rlloom_apps.search_agent.format_reward import FormatRewardSearchEnv, Segment, score_segments
from rlloom_apps.search_agent.settings import CONFIGS, FormatRewardSettings, load_train_config

from rlloom.agent import Sample
from rlloom.agent.envs.search import SEARCH_R1_INVALID_ACTION
from rlloom.core_rl.tiny import save_tiny_model
from rlloom.retrieval import Hit, build_index
from rlloom.rewards.format import search_r1_format_reward

GOLD = {"target": ["Paris"]}
PASSAGE = 'Doc 1(Title: "Paris") Paris is the capital of France.'
SEARCH = "<think> I need to look it up. </think>\n<search> capital of france </search>"
PUBLISHED = FormatRewardSettings()


def model(text: str) -> Segment:
    return Segment("model", text)


def info(text: str = PASSAGE) -> Segment:
    return Segment("information", text)


def searched(answer_turn: str) -> list[Segment]:
    return [model(SEARCH), info(), model(f"<think> found it </think>\n{answer_turn}")]


def as_text(segments: list[Segment]) -> str:
    """The conversation as Search-R1 decodes it: passages wrapped in their block, the hint as it is."""
    wrap = {"model": "{}", "information": "\n\n<information>{}</information>\n\n", "environment": "{}"}
    return "".join(wrap[s.source].format(s.text) for s in segments)


CASES = [
    (searched("<answer> Paris </answer>"), 1.0),  # correct, valid
    ([model("<think> easy </think>\n<answer> paris. </answer>")], 1.0),  # normalised EM, no search needed
    ([model("Sure! <think> easy </think><answer> Paris </answer>")], 0.8),  # text outside tags: invalid
    ([model("<answer> Paris </answer>")], 0.8),  # no <think> before the answer: invalid
    (searched("<answer> Lyon </answer>"), 0.2),  # wrong, valid (retrieval_score 0)
    ([model("<think> hm </think><answer> Lyon </answer> and more")], 0.1),  # wrong, invalid
    ([model("<think> hm </think><search> x </search>"), info(), model("<think> y </think><answer> Lyon")], 0.0),
]


@pytest.mark.parametrize(("segments", "expected"), CASES)
def test_published_scores_on_hand_worked_cases(segments: list[Segment], expected: float) -> None:
    assert score_segments(segments, GOLD, PUBLISHED).score == pytest.approx(expected)
    # Search-R1's own reading of the same conversation as one string agrees where no observation holds a tag
    assert search_r1_format_reward(as_text(segments), ["Paris"]).score == pytest.approx(expected)


def test_retrieval_score_is_added_to_a_valid_wrong_answer_that_retrieved_the_gold() -> None:
    settings = FormatRewardSettings(retrieval_score=0.1)
    assert score_segments(searched("<answer> Lyon </answer>"), GOLD, settings).score == pytest.approx(0.3)
    elsewhere = [model(SEARCH), info('Doc 1(Title: "Lyon") Lyon is a city.'), model("<think> x </think><answer> Rome")]
    elsewhere[-1] = model("<think> x </think><answer> Rome </answer>")
    assert score_segments(elsewhere, GOLD, settings).score == pytest.approx(0.2)


TOWER = {"target": ["Eiffel Tower"]}
F1 = FormatRewardSettings(answer_score="f1")


@pytest.mark.parametrize(
    ("segments", "settings", "expected"),
    [
        # "the Tower" against "Eiffel Tower": normalised tokens {tower} vs {eiffel, tower}: P 1, R 1/2, F1 2/3
        (searched("<answer> the Tower </answer>"), F1, 0.2 + (1 - 0.2) * 2 / 3),  # valid: 0.2 -> 1
        ([model("<think> hm </think><answer> the Tower </answer> and more")], F1, 0.1 + (0.8 - 0.1) * 2 / 3),
        (
            searched("<answer> the Tower </answer>"),
            FormatRewardSettings(answer_score="f1", retrieval_score=0.1),
            0.2 + 0.8 * 2 / 3,
        ),  # the passage is about Paris: no gold retrieved, no bonus
        (
            [
                model(SEARCH),
                info('Doc 1(Title: "Eiffel Tower") The Eiffel Tower is in Paris.'),
                model("<think> x </think>\n<answer> the Tower </answer>"),
            ],
            FormatRewardSettings(answer_score="f1", retrieval_score=0.1),
            0.3 + 0.7 * 2 / 3,
        ),  # gold retrieved: from 0.3
        (searched("<answer> Eiffel Tower </answer>"), F1, 1.0),  # F1 1: the right answer's entry
        ([model("<answer> Eiffel Tower </answer>")], F1, 0.8),
        (searched("<answer> Lyon </answer>"), F1, 0.2),  # F1 0: the wrong answer's entry
        (searched("<answer> the Tower </answer>"), PUBLISHED, 0.2),  # EM: a partial answer is wrong
    ],
)
def test_f1_answer_score_moves_each_entry_from_wrong_to_right(
    segments: list[Segment], settings: FormatRewardSettings, expected: float
) -> None:
    reward = score_segments(segments, TOWER, settings)
    assert reward.score == pytest.approx(expected)


def test_f1_answer_score_agrees_with_the_published_table_at_f1_0_and_1() -> None:
    for segments, expected in CASES:
        assert score_segments(segments, GOLD, F1).score == pytest.approx(expected)


def test_the_invalid_action_hint_is_not_an_answer() -> None:
    """The reported bug: the hint's "<answer> and </answer>" was read as the model's (wrong) answer, 0.1 for a
    model that never wrote an action; it scores 0 and its honest twin, which answers after the hint, 0.8."""
    never = [model("blah"), Segment("environment", SEARCH_R1_INVALID_ACTION), model("blah")]
    assert search_r1_format_reward(as_text(never), ["Paris"]).score == pytest.approx(0.1)  # Search-R1's reading
    reward = score_segments(never, GOLD, PUBLISHED)
    assert reward.score == 0.0 and reward.components == {"em": 0.0, "f1": 0.0, "format_valid": 0.0}
    honest = [*never[:2], model("<think> ok </think><answer> Paris </answer>")]
    reward = score_segments(honest, GOLD, PUBLISHED)
    assert reward.score == pytest.approx(0.8)  # correct, and the corrected turn makes the sequence invalid
    assert reward.components == {"em": 1.0, "f1": 1.0, "format_valid": 0.0}


def test_a_passage_holding_the_answer_tag_is_not_an_answer() -> None:
    leaky = info('Doc 1(Title: "Quiz") <answer> Paris </answer>')
    never = [model(SEARCH), leaky, model("<think> the passage says it </think>")]
    reward = score_segments(never, GOLD, PUBLISHED)
    assert reward.score == 0.0 and reward.components["em"] == 0.0  # no answer; the sequence is incomplete
    honest = [model(SEARCH), leaky, model("<think> the passage says it </think><answer> Paris </answer>")]
    reward = score_segments(honest, GOLD, PUBLISHED)
    assert reward.score == 1.0 and reward.components == {"em": 1.0, "f1": 1.0, "format_valid": 1.0}
    # Search-R1 reads the passage's tags: the never-answering model is credited the gold, in an invalid sequence
    assert search_r1_format_reward(as_text(never), ["Paris"]).score == pytest.approx(0.8)


class OnePassage:
    def __init__(self, text: str = "Paris is the capital of France.") -> None:
        self.text = text

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return [[Hit(doc_id="0", score=1.0, title="Paris", text=self.text)] for _ in queries]


def play(env: FormatRewardSearchEnv, *turns: str) -> Any:
    env.reset(Sample(question="what is the capital of france", ground_truth=GOLD))

    async def run() -> Any:
        for turn in turns:
            await env.step(turn)
        return await env.reward(None)  # type: ignore[arg-type]

    return asyncio.run(run())


def test_env_scores_the_turns_with_the_information_between_them() -> None:
    env = FormatRewardSearchEnv(OnePassage(), None, format_reward=PUBLISHED)
    reward = play(env, SEARCH, "<think> found it </think>\n<answer> Paris </answer>")
    assert [s.source for s in env._segments] == ["model", "information", "model"]
    # the model's turns alone (what plain SearchEnv scores) are not a valid sequence: </search> then <think>
    assert search_r1_format_reward("".join(env._actions), ["Paris"]).score == pytest.approx(0.8)
    assert reward.score == pytest.approx(1.0)
    assert reward.components == {"em": 1.0, "f1": 1.0, "format_valid": 1.0}


@pytest.mark.parametrize(("last", "score"), [("<think> it says so </think>", 0.0), ("<answer> Paris </answer>", 0.8)])
def test_env_never_reads_an_observation_as_the_answer(last: str, score: float) -> None:
    """Through the env: a passage with `<answer> Paris </answer>` and the corrective hint are in the
    conversation, the model answers only in the honest twin."""
    env = FormatRewardSearchEnv(OnePassage("<answer> Paris </answer>"), None, format_reward=PUBLISHED)
    reward = play(env, SEARCH, "no action here", last)
    assert [s.source for s in env._segments][:5] == ["model", "information", "model", "environment", "model"]
    assert reward.score == pytest.approx(score)
    assert reward.components["em"] == (1.0 if score else 0.0)


def test_config_section_selects_it_and_rejects_unknown_keys() -> None:
    _, search = load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m", "search.format_reward={}"])
    assert search.format_reward == PUBLISHED
    _, plain = load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m"])
    assert plain.format_reward is None
    with pytest.raises((ValidationError, ValueError), match="structure_score"):
        load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m", "search.format_reward={structure_score: 0.3}"])
    _, graded = load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m", "search.format_reward.answer_score=f1"])
    assert graded.format_reward == FormatRewardSettings(answer_score="f1")
    with pytest.raises((ValidationError, ValueError), match="answer_score"):
        load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m", "search.format_reward={answer_score: F1-score}"])


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
    # "<answer> and </answer>": Search-R1 reads that as a wrong answer (0.1 every time); the model never answered
    assert step["reward/mean"] == 0.0 and step["reward/std"] == 0.0
    assert step["reward_components/em"] == 0.0 and step["reward_components/format_valid"] == 0.0
    assert step["reward_components/f1"] == 0.0
    assert "reward_components/outcome" not in step
