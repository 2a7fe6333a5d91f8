"""avg@k, pass@k and maj@k against hand-computed values and brute-force enumeration."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from rlloom.rewards.at_k import (
    ProblemSamples,
    avg_at_k,
    group_answers,
    maj_at_k,
    majority_correct,
    pass_at_k,
    summarize,
)
from rlloom.rewards.math import is_equivalent


def brute_pass_at_k(correct: list[bool], k: int) -> float:
    """Share of k-subsets holding at least one correct sample (the definition the estimator is unbiased for)."""
    subsets = list(itertools.combinations(correct, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(("n", "c", "k", "expected"), [(2, 1, 1, 0.5), (4, 1, 2, 0.5), (5, 0, 3, 0.0), (3, 2, 2, 1.0)])
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    # (4, 1, 2): C(3,2)/C(4,2) = 3/6 pairs miss the one correct sample
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_matches_combinatorial_definition() -> None:
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(1, 12)
        correct = [rng.random() < 0.4 for _ in range(n)]
        k = rng.randint(1, n)
        c = sum(correct)
        assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(correct, k))
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_large_n_stays_finite() -> None:
    # C(1000, 500) overflows a float; the product form does not
    assert 0.0 < pass_at_k(1000, 1, 500) == pytest.approx(0.5)


def test_pass_at_k_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="k=5 must lie in 1..n=4"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c=5"):
        pass_at_k(4, 5, 1)


def test_avg_at_k() -> None:
    assert avg_at_k([1.0, 0.0, 0.5, 0.5]) == 0.5
    with pytest.raises(ValueError):
        avg_at_k([])


def test_majority_hand_computed() -> None:
    # A A B: A wins and is right
    assert majority_correct([0, 0, 1], [True, True, False]) == 1.0
    # A B tie, one right: 0.5 in expectation
    assert majority_correct([0, 1], [True, False]) == 0.5
    # abstentions never win; only abstentions score 0
    assert majority_correct([None, None, 1], [False, False, True]) == 1.0
    assert majority_correct([None, None], [False, False]) == 0.0


def test_maj_at_k_averages_over_subsets() -> None:
    labels, correct = [0, 0, 1], [True, True, False]
    # k=1: 2 of 3 singletons right. k=2: {0,1} -> A (1), {0,2} and {1,2} tie (0.5 each) -> 2/3. k=3: A -> 1.
    assert maj_at_k(labels, correct, 1) == pytest.approx(2 / 3)
    assert maj_at_k(labels, correct, 2) == pytest.approx(2 / 3)
    assert maj_at_k(labels, correct, 3) == 1.0


def test_maj_at_k_sampled_agrees_with_exact() -> None:
    rng = random.Random(0)
    labels: list[int | None] = [rng.choice([0, 0, 0, 1, 2, None]) for _ in range(20)]
    correct = [label == 0 for label in labels]
    exact = maj_at_k(labels, correct, 3)  # C(20, 3) = 1140 subsets: enumerated
    sampled = maj_at_k(labels, correct, 3, draws=4000, seed=1, exact_limit=0)  # random subsets instead
    assert sampled == pytest.approx(exact, abs=0.03)
    assert sampled == maj_at_k(labels, correct, 3, draws=4000, seed=1, exact_limit=0)  # seeded: repeatable


def test_group_answers_with_math_equivalence() -> None:
    answers = ["1/2", "0.5", "\\frac{1}{2}", "2", None, "1/2"]
    assert group_answers(answers) == [0, 1, 2, 3, None, 0]
    assert group_answers(answers, is_equivalent) == [0, 0, 0, 1, None, 0]


def test_summarize_hand_computed() -> None:
    problems = [
        ProblemSamples([1.0, 0.0, 0.0, 1.0], [True, False, False, True], [0, 1, 1, 0]),  # tie 0/1 at k=4
        ProblemSamples([0.0, 0.0, 0.0, 0.0], [False] * 4, [0, 0, 1, None]),
    ]
    out = summarize(problems, [1, 4])
    assert out["avg@4"] == pytest.approx(0.25)
    assert out["pass@1"] == pytest.approx(0.25)
    assert out["pass@4"] == pytest.approx(0.5)
    assert out["maj@1"] == pytest.approx(0.25)  # maj@1 is avg@n for binary scores
    assert out["maj@4"] == pytest.approx(0.25)  # problem 1 ties (0.5), problem 2 wrong
    assert list(out) == ["avg@4", "pass@1", "pass@4", "maj@1", "maj@4"]
    assert list(summarize(problems, [2], majority=False)) == ["avg@4", "pass@2"]


def test_summarize_refuses_bad_shapes() -> None:
    with pytest.raises(ValueError, match="same number of samples"):
        summarize([ProblemSamples([1.0], [True]), ProblemSamples([1.0, 0.0], [True, False])], [1])
    with pytest.raises(ValueError, match="k=\\[8\\] exceed the 4 samples"):
        summarize([ProblemSamples([1.0] * 4, [True] * 4)], [1, 8])
    with pytest.raises(ValueError, match="one entry per sample"):
        ProblemSamples([1.0, 0.0], [True])


def test_groups_holding_a_correct_answer_merge_into_one() -> None:
    from rlloom.rewards.at_k import gold_votes_together

    # labels: 0 = "80" (right), 1 = "D" (right, the same choice), 2 = "60", 0 again, None (no answer)
    merged = gold_votes_together([0, 1, 2, 0, None], [True, True, False, True, False])
    assert merged == [0, 0, 2, 0, None]
    assert gold_votes_together([0, 1], [False, False]) == [0, 1]  # nothing right: labels unchanged
    assert maj_at_k(merged[:3], [True, True, False], 3) == 1.0 and maj_at_k([0, 1, 2], [True, True, False], 3) < 1.0


def test_answers_the_scorer_rejects_never_vote_for_the_gold() -> None:
    """Where the equivalence grouping and the scorer disagree (the grouping put one accepted sample with four
    rejected ones), only the accepted sample joins the gold's votes: the four rejected still out-vote the gold's
    three, so maj@10 is 0 (merging the whole group gave the gold 7 votes, 3 of them right: 3/7)."""
    from rlloom.rewards.at_k import gold_votes_together

    labels = [0, 0, 0, 0, 0, 1, 1, 2, 2, 2]  # 0: "W" (and one sample the scorer accepts), 1: gold, 2: "V"
    correct = [False, False, False, False, True, True, True, False, False, False]
    voted = gold_votes_together(labels, correct)
    assert voted == [3, 3, 3, 3, 0, 0, 0, 2, 2, 2]
    assert maj_at_k(voted, correct, 10) == 0.0
