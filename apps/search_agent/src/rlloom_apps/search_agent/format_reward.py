"""Search-R1 v0.3's format reward (`qa_em_format`, its `train_grpo_format.sh`/`train_ppo_format.sh` runs) for
`search-agent train`, chosen with the config's `search.format_reward:` section.

Search-R1 scores the whole decoded sequence after the assistant marker: the model's turns with the
observations between them. Read that way, text the model never wrote counts as its answer: the environment's
invalid-action hint holds "<answer> and </answer>", so a model that never wrote an action scored 0.1 ("wrong
answer, invalid format") on every conversation, and a passage holding `<answer>...</answer>` would be read as
the model's answer. `FormatRewardSearchEnv` keeps the conversation as segments that say who wrote them, and
`score_segments` reads each for what it is (the differences from Search-R1, all on text the model did not write):
- the answer is the last `<answer>` of the model's own turns;
- the sequence check (think -> search -> information -> think ... -> answer) sees the model's turns with an
  empty `<information></information>` where a search's passages were, so tags inside a passage neither break
  nor forge the structure;
- a turn answered by the invalid-action hint makes the sequence invalid (in Search-R1 the hint's text outside
  any tag does the same);
- `retrieval_score` still looks for a gold alias inside the retrieved passages, block by block: that term is
  about what was retrieved.
A conversation without hints and without tags inside its passages scores exactly as Search-R1's reading of the
whole text (`rlloom.rewards.format.search_r1_format_reward`); the tests check both.
`answer_score: f1` grades the answer by its token F1 instead of exact match (R1-Searcher's answer reward): each
row of the table moves linearly from the wrong answer's score to the right one's, so a partly right answer earns
part of the difference; a small model that is rarely exactly right still gets a graded signal within a group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from rlloom_apps.search_agent.settings import FormatRewardSettings

from rlloom.agent import SearchEnv
from rlloom.agent.environment import StepResult
from rlloom.core_rl import RewardOutput, Trajectory
from rlloom.rewards.format import FormatCheck, search_r1_sequence
from rlloom.rewards.qa import exact_match, extract_tagged_answer, f1, normalize_answer, qa_golds


class Segment(NamedTuple):
    """One piece of a conversation and who wrote it: the model, retrieval (an `<information>` block's body) or
    the environment (the invalid-action hint)."""

    source: Literal["model", "information", "environment"]
    text: str


class FormatRewardSearchEnv(SearchEnv):
    """`SearchEnv` rewarded by Search-R1's `qa_em_format` table, read per segment (see the module docstring)."""

    def __init__(self, *args: Any, format_reward: FormatRewardSettings, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.format_reward = format_reward
        self._segments: list[Segment] = []

    async def step(self, action: str, *, last_turn: bool = False) -> StepResult:
        result = await super().step(action, last_turn=last_turn)
        self._segments.append(Segment("model", action))
        obs = result.observation
        if obs is not None and obs.text is not None:
            retrieved = f"<{self.config.information_tag}>" in obs.before
            self._segments.append(Segment("information" if retrieved else "environment", obs.text))
        return result

    async def reward(self, trajectory: Trajectory) -> RewardOutput:
        if self._sample is None:
            raise RuntimeError("FormatRewardSearchEnv.reward called before reset()")
        return score_segments(self._segments, self._sample.ground_truth, self.format_reward)


def score_segments(segments: Sequence[Segment], ground_truth: Any, settings: FormatRewardSettings) -> RewardOutput:
    """Search-R1's `qa_em_format` reward of one conversation, with EM, F1 and validity logged beside it; only
    the model's segments can answer or make the structure."""
    try:
        golds = qa_golds(ground_truth)
    except (TypeError, ValueError) as exc:
        return RewardOutput(score=0.0, error=f"bad ground_truth: {exc}")
    model_text = "".join(s.text for s in segments if s.source == "model")
    answer = extract_tagged_answer(model_text)
    valid = sequence_check(segments)
    retrieved = False
    if valid.score and settings.retrieval_score:  # block by block, as Search-R1's is_retrieval_correct
        docs = [normalize_answer(s.text) for s in segments if s.source == "information"]
        aliases = [a for a in (normalize_answer(g) for g in golds) if a]
        retrieved = any(a in doc for doc in docs for a in aliases)
    em = float(answer is not None and bool(exact_match(answer, golds)))
    f1_score = f1(answer, golds) if answer is not None else 0.0
    rightness = None if answer is None else (em if settings.answer_score == "em" else max(em, f1_score))
    score = qa_format_score(rightness, valid=bool(valid.score), retrieved=retrieved, settings=settings)
    components = {"em": em, "f1": f1_score, "format_valid": valid.score}
    return RewardOutput(score=score, components=components)


def sequence_check(segments: Sequence[Segment]) -> FormatCheck:
    """Search-R1's `is_valid_sequence` over the model's turns with an empty block where each search's passages
    were; a turn the environment had to correct makes it invalid."""
    if any(s.source == "environment" for s in segments):
        return FormatCheck(0.0, "a turn had neither a search nor an answer (the environment corrected it)")
    skeleton = "".join(s.text if s.source == "model" else "\n\n<information></information>\n\n" for s in segments)
    return search_r1_sequence(skeleton)


def qa_format_score(rightness: float | None, *, valid: bool, retrieved: bool, settings: FormatRewardSettings) -> float:
    """Search-R1's `qa_em_format.compute_score_em` table: correct+valid 1, correct+invalid 1-s, wrong or missing
    +valid s (+retrieval_score when a gold alias was retrieved), wrong+invalid f, missing+invalid 0.

    `rightness` is None without an answer, else 1 (right) or 0 (wrong) under EM, or the answer's F1 under
    `answer_score: f1`, which moves the score linearly from the wrong answer's entry to the right answer's."""
    s = settings.structure_format_score
    if valid:
        wrong = s + (settings.retrieval_score if retrieved else 0.0)
        return wrong if rightness is None else wrong + (1.0 - wrong) * rightness
    if rightness is None:
        return 0.0
    wrong = settings.final_format_score
    return wrong + (1.0 - s - wrong) * rightness
