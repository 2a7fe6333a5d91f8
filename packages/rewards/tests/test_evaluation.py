"""evaluate_samples: real scorers (math checker, code sandbox) on hand-written samples, figures computed by hand."""

from __future__ import annotations

import pytest

from rlloom.rewards.evaluation import evaluate_samples, voting_rule


def math_row(gold: str) -> dict[str, object]:
    return {"data_source": "math500", "reward_model": {"style": "rule", "ground_truth": gold}, "extra_info": {}}


def test_math_figures_match_hand_computation() -> None:
    rows = [math_row("\\frac{1}{2}"), math_row("7")]
    responses = [
        ["so \\boxed{0.5}", "\\boxed{1/2}", "\\boxed{3}", "I give up"],  # right, right, wrong, no answer
        ["\\boxed{7}", "\\boxed{8}", "\\boxed{8}", "\\boxed{9}"],  # one right, the majority wrong
    ]
    report = evaluate_samples(rows, responses, [1, 2, 4], workers=1)
    (source,) = report.sources
    assert (source.data_source, source.problems, source.samples_per_problem) == ("math500", 2, 4)
    m = source.metrics
    assert m["avg@4"] == pytest.approx((0.5 + 0.25) / 2)
    assert m["pass@1"] == pytest.approx((0.5 + 0.25) / 2)
    # 1 - C(n-c, 2) / C(4, 2): 1 - 1/6 and 1 - 3/6
    assert m["pass@2"] == pytest.approx((5 / 6 + 0.5) / 2)
    assert m["pass@4"] == pytest.approx(1.0)
    # 0.5 and 1/2 vote together (2 of 4) and are right; 8 wins the second problem
    assert m["maj@4"] == pytest.approx(0.5)
    # pairs of problem 1: {A,A} 1, {A,B} x2 ties 0.5, {A,-} x2 1, {B,-} 0 -> 4/6; problem 2: three ties with 7
    # score 0.5, the other three pairs lose -> 0.25
    assert m["maj@2"] == pytest.approx((4 / 6 + 0.25) / 2)
    assert source.no_answer == 1
    assert source.scoring_errors == 0
    assert [r.correct for r in report.records[:4]] == [True, True, False, False]
    assert report.records[5].extracted == "8"
    table = report.table()
    assert (
        table.splitlines()[0] == "| data source | problems | avg@4 | pass@1 | pass@2 | pass@4 | maj@1 | maj@2 | maj@4 |"
    )
    assert "| math500 | 2 | 37.5 | 37.5 | 66.7 | 100.0 | 37.5 | 45.8 | 50.0 |" in table


def test_code_is_run_in_the_sandbox_and_not_voted_on() -> None:
    truth = {
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(0, 0) == 0\n",
        "entry_point": "add",
    }
    row = {"data_source": "humaneval", "reward_model": {"ground_truth": truth}, "extra_info": {"partial": False}}
    right = "```python\ndef add(a, b):\n    return a + b\n```"
    half = "```python\ndef add(a, b):\n    return a * b + (a == 0) * 0\n```"  # passes the 0+0 case only
    report = evaluate_samples([row, row], [[right, half], [half, half]], [1, 2], workers=1)
    (source,) = report.sources
    assert source.metrics == pytest.approx({"avg@2": 0.25, "pass@1": 0.25, "pass@2": 0.5})
    assert [r.score for r in report.records] == [1.0, 0.0, 0.0, 0.0]  # partial=False: all tests or nothing


def test_sources_are_reported_apart() -> None:
    rows = [math_row("2"), {**math_row("3"), "data_source": "gsm8k"}]
    report = evaluate_samples(rows, [["\\boxed{2}"], ["\\boxed{4}"]], [1], workers=0)
    assert {s.data_source: s.metrics["avg@1"] for s in report.sources} == {"math500": 1.0, "gsm8k": 0.0}


def test_bad_rows_are_named() -> None:
    with pytest.raises(ValueError, match="rows\\[0\\] has no 'data_source'"):
        evaluate_samples([{"reward_model": {"ground_truth": "1"}}], [["x"]], [1])
    with pytest.raises(ValueError, match="rows\\[0\\] has no 'reward_model'"):
        evaluate_samples([{"data_source": "gsm8k"}], [["x"]], [1])
    with pytest.raises(ValueError, match="2 rows but 1 response lists"):
        evaluate_samples([math_row("1"), math_row("2")], [["x"]], [1])
    with pytest.raises(ValueError, match="k=\\[2\\] exceed"):
        evaluate_samples([math_row("1")], [["\\boxed{1}"]], [2], workers=0)


def test_voting_rule_by_answer_kind() -> None:
    math_vote = voting_rule("lighteval/MATH")
    assert math_vote is not None and math_vote[0] == "math"
    assert math_vote[1] is not None and math_vote[1]("0.5", "\\frac12")
    qa_vote = voting_rule("nq")
    assert qa_vote is not None and qa_vote[1] is not None and qa_vote[1]("The Beatles", "beatles")
    assert voting_rule("humaneval") is None


def test_a_gold_given_as_aliases_gets_one_vote() -> None:
    """Geometry3K's gold names the value and its choice letter: "80" and "D" are the same answer, so with one vote
    each against 60 and 40 they win maj@4 (split, the four-way tie gave 0.5)."""
    row = {"data_source": "geometry3k", "reward_model": {"ground_truth": ["80", "D"]}, "extra_info": {}}
    report = evaluate_samples([row], [["\\boxed{80}", "\\boxed{D}", "\\boxed{60}", "\\boxed{40}"]], [4], workers=1)
    assert [r.correct for r in report.records] == [True, True, False, False]
    assert report.sources[0].metrics["maj@4"] == pytest.approx(1.0)
