"""Issue 39, QA: a gold that SQuAD normalisation empties, and cover-EM on an answer that lists several candidates.
Each class as hostile cases refused and honest twins accepted; expectations computed by hand in the comments.
"""

from __future__ import annotations

import pytest

from rlloom.rewards.qa import (
    exact_match,
    f1,
    hedged,
    listed_candidates,
    normalize_answer,
    qa_em_scorer,
    qa_f1_scorer,
    qa_substring_scorer,
    raw_form,
    substring_match,
)

# ---------------------------------------------------------------- golds that normalise to nothing

EMPTYING_GOLDS = ["A+", ")", "The The", "a", "?!"]


@pytest.mark.parametrize("gold", EMPTYING_GOLDS)
def test_these_golds_do_normalise_to_nothing(gold: str) -> None:
    assert normalize_answer(gold) == ""  # lower, punctuation deleted, articles dropped: nothing is left


@pytest.mark.parametrize("gold", EMPTYING_GOLDS)
@pytest.mark.parametrize("pred", ["", "   ", "!!!", "the", "an ."])
def test_an_answer_that_also_normalises_to_nothing_is_not_a_match(gold: str, pred: str) -> None:
    # Under SQuAD normalisation both sides are "" and EM would be 1.0; raw text: "" or "!!!" is not "a+".
    assert raw_form(pred) != raw_form(gold)
    assert exact_match(pred, gold) == 0.0
    assert substring_match(pred, gold) == 0.0
    # raw tokens: ["the"] against ["the", "the"] share one (precision 1, recall 1/2, F1 2/3); the rest share none
    assert f1(pred, gold) == pytest.approx(2 / 3 if (pred, gold) == ("the", "The The") else 0.0)


@pytest.mark.parametrize(
    ("pred", "gold", "em"),
    [
        ("A+", "A+", 1.0),
        ("a+", "A+", 1.0),  # case folded
        ("  A+ ", "A+", 1.0),  # stripped
        ("A", "A+", 0.0),  # the "+" is the answer
        ("A-", "A+", 0.0),
        (")", ")", 1.0),
        ("the the", "The The", 1.0),
        ("The  The", "The The", 1.0),  # spaces collapsed
        ("The", "The The", 0.0),
        ("The Who", "The The", 0.0),
    ],
)
def test_against_such_a_gold_the_raw_text_decides(pred: str, gold: str, em: float) -> None:
    assert exact_match(pred, gold) == em


def test_f1_and_cover_em_against_such_a_gold() -> None:
    # raw tokens ["my", "grade:", "a+"] against ["a+"]: precision 1/3, recall 1, F1 = 2 * (1/3) / (4/3) = 0.5
    assert f1("my grade: A+", "A+") == pytest.approx(0.5)
    assert f1("A", "A+") == 0.0
    assert substring_match("my grade is A+", "A+") == 1.0
    assert substring_match("my grade is A+.", "A+") == 1.0  # "." after it: still a whole token
    assert substring_match("my grade is A", "A+") == 0.0
    assert substring_match("they played The The's song", "The The") == 1.0
    assert substring_match("they played The song", "The The") == 0.0


def test_the_scorers_refuse_an_empty_answer_to_such_a_gold() -> None:
    for scorer in (qa_em_scorer, qa_f1_scorer, qa_substring_scorer):
        assert scorer("<answer></answer>", "A+").score == 0.0
        assert scorer("<answer> </answer>", ["The The"]).score == 0.0
        assert scorer("<answer>A+</answer>", "A+").score == 1.0
        assert scorer("<answer>The The</answer>", {"target": ["The The"]}).score == 1.0


def test_ordinary_golds_keep_squad_normalisation() -> None:
    assert exact_match("The Beatles!", ["beatles"]) == 1.0
    assert exact_match("", "The Beatles") == 0.0
    assert exact_match("", "") == 1.0  # an empty gold: SQuAD v2's no-answer, as before


# ---------------------------------------------------------------- cover-EM and lists of candidates


@pytest.mark.parametrize(
    ("pred", "golds"),
    [
        ("Paris or London", "Paris"),
        ("either Paris or Lyon", "Paris"),
        ("Paris/London", "Paris"),
        ("Paris | London", "Paris"),
        ("Paris; London", "Paris"),
        ("Paris and/or London", "Paris"),
        ("Paris, London, Rome", "Paris"),  # three comma items
        ("Paris, London or Rome", "Rome"),
        ("1990, 1991", "1990"),  # two plain numbers
        ("1990 or 1991", "1990"),
        ("1,000 or 2,000", "1,000"),
        ("Washington, D.C. or Boston", "Washington, D.C."),
        ("A+ or B", "A+"),  # a gold that normalises to nothing, hedged
    ],
)
def test_cover_em_refuses_a_list_of_candidates(pred: str, golds: str) -> None:
    assert substring_match(pred, golds) == 0.0
    assert hedged(pred, golds) is not None
    # the list did contain the gold: Search-R1's subEM (raw `in`, lists allowed) credits it
    assert substring_match(pred, golds, word_boundary=False, refuse_lists=False) == 1.0


@pytest.mark.parametrize(
    ("pred", "golds"),
    [
        ("Paris", "Paris"),
        ("the city of Paris", "Paris"),  # the gold in a natural phrase
        ("Paris is the capital", "Paris"),
        ("Barack Obama", "Obama"),
        ("in 1990", "1990"),
        ("Paris, France", "Paris"),  # two comma items: a phrase
        ("June 5, 1990", "1990"),
        ("Springfield, Illinois", "Springfield"),
        ("Simon and Garfunkel", "Simon"),  # "and" never separates
        ("Washington, D.C., USA", "Washington, D.C."),  # the gold's own comma is not counted
        ("To be or not to be", "To be or not to be"),  # the gold's own "or" is not counted
        ("1/2 of the votes", "1/2"),  # a slash between digits is a fraction
        ("1,000 people", "1,000"),  # a thousands separator is no comma
        ("USA or United States", ["USA", "United States"]),  # every item is a gold alias: one answer twice
        ("either Paris", "Paris"),
        ("Paris or", "Paris"),  # an empty item does not count
    ],
)
def test_cover_em_credits_an_honest_answer_containing_the_gold(pred: str, golds: str | list[str]) -> None:
    assert substring_match(pred, golds) == 1.0


def test_two_names_joined_by_one_comma_read_as_a_phrase() -> None:
    # The documented gap: "Paris, France" and "Paris, Lyon" have the same shape, and the first is honest.
    assert substring_match("Paris, Lyon", "Paris") == 1.0
    assert substring_match("Paris, Lyon, Nice", "Paris") == 0.0  # a third item makes it a list


def test_listed_candidates_reports_the_items() -> None:
    assert listed_candidates("Paris, London or Rome", "Rome") == ["Paris", "London", "Rome"]
    assert listed_candidates("either Paris or Lyon", "Paris") == ["either Paris", "Lyon"]
    assert listed_candidates("Paris, France", "Paris") is None
    assert listed_candidates("Washington, D.C. or Boston", "Washington, D.C.") == ["Washington, D.C.", "Boston"]


def test_the_scorer_says_why_cover_em_refused() -> None:
    result = qa_substring_scorer("<answer>Paris or London</answer>", "Paris")
    assert result.score == 0.0 and result.components["sub_em"] == 0.0
    assert "lists 2 candidates" in result.details["reason"]
    assert qa_substring_scorer("<answer>the city of Paris</answer>", "Paris").score == 1.0
    # EM and F1 are unchanged by the rule: a hedge already fails EM, and F1 pays for the extra words
    assert qa_em_scorer("<answer>Paris or London</answer>", "Paris").components["f1"] == pytest.approx(0.5)


def test_search_r1_subem_is_still_available() -> None:
    # Search-R1's raw `in`: gold "1" inside "1990", and a hedge credited
    assert substring_match("in 1990", "1", word_boundary=False, refuse_lists=False) == 1.0
    assert substring_match("1990 or 1991", "1990", word_boundary=False, refuse_lists=False) == 1.0
    assert substring_match("1990 or 1991", "1990", word_boundary=False) == 0.0
