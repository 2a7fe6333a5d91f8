"""QA metrics against hand-computed values and against the official SQuAD v1.1 formulas written out here."""

from __future__ import annotations

import re
import string
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlloom.rewards.qa import (
    exact_match,
    extract_tagged_answer,
    f1,
    normalize_answer,
    qa_em_scorer,
    qa_f1_scorer,
    qa_golds,
    substring_match,
)


# --- second implementation: SQuAD v1.1 evaluate-v1.1.py, transcribed ---
def squad_normalize(s: str) -> str:
    def remove_articles(text: str) -> str:
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text: str) -> str:
        return " ".join(text.split())

    def remove_punc(text: str) -> str:
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def squad_f1(prediction: str, ground_truth: str) -> float:
    prediction_tokens = squad_normalize(prediction).split()
    ground_truth_tokens = squad_normalize(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def squad_em(prediction: str, ground_truth: str) -> float:
    return float(squad_normalize(prediction) == squad_normalize(ground_truth))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  An   apple, a day ", "apple day"),
        ("U.S.A.", "usa"),
        ("Theatre", "theatre"),  # 'the' only as a whole word
        ("", ""),
    ],
)
def test_normalize_answer_by_hand(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_exact_match_and_f1_by_hand() -> None:
    assert exact_match("The Beatles", ["beatles", "Fab Four"]) == 1.0
    assert exact_match("Beatles band", "beatles") == 0.0
    # pred tokens: cat sat on mat (4); gold: cat on mat (3); overlap 3 -> P=3/4, R=1, F1 = 2*.75/1.75 = 6/7
    assert f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7)
    # max over aliases: "barack obama" vs ["obama", "president obama"] -> 2/3 and 1/2 -> 2/3
    assert f1("Barack Obama", ["Obama", "President Obama"]) == pytest.approx(max(2 * 0.5 * 1 / 1.5, 0.5))
    assert f1("paris", "london") == 0.0


def test_substring_match_word_boundary() -> None:
    assert substring_match("It was in 1990.", "1990") == 1.0
    assert substring_match("It was in 1990.", "1") == 0.0  # no credit for a digit inside a year
    assert substring_match("It was in 1990.", "1", word_boundary=False) == 1.0  # Search-R1's raw `in`
    assert substring_match("New York City", ["new york", "NYC"]) == 1.0


def test_bad_golds_are_clear() -> None:
    with pytest.raises(ValueError, match="empty list"):
        exact_match("x", [])
    with pytest.raises(TypeError, match="golds must be"):
        f1("x", 3)  # type: ignore[arg-type]
    assert qa_golds({"target": ["a", "b"]}) == ["a", "b"]
    with pytest.raises(ValueError, match="'target'"):
        qa_golds({"answers": ["a"]})


_TOKENS = ["a", "b", "c", "x", "yz", " ", "the", "an", "A", "The", ",", ".", "!", "'", "-"]
_TEXT = st.lists(st.sampled_from(_TOKENS), max_size=12).map("".join)


def reference_f1(pred: str, gold: str) -> float:
    """SQuAD v1.1 F1, except that an empty side follows v2.0 (empty == empty is 1, else 0), as we do."""
    if not squad_normalize(pred) or not squad_normalize(gold):
        return float(squad_normalize(pred) == squad_normalize(gold))
    return squad_f1(pred, gold)


def raw(s: str) -> str:
    return " ".join(s.split()).casefold()


def reference_em(pred: str, gold: str) -> float:
    """SQuAD EM, except against a gold that normalises to nothing ("A+", "The The"): stripped raw text (issue 39)."""
    return squad_em(pred, gold) if squad_normalize(gold) else float(raw(pred) == raw(gold))


def reference_f1_raw_aware(pred: str, gold: str) -> float:
    if squad_normalize(gold):
        return reference_f1(pred, gold)
    p, g = raw(pred).split(), raw(gold).split()
    if not p or not g:
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    return 0.0 if common == 0 else 2 * (common / len(p)) * (common / len(g)) / (common / len(p) + common / len(g))


@settings(max_examples=300, deadline=None)
@given(pred=_TEXT, golds=st.lists(_TEXT, min_size=1, max_size=3))
def test_matches_official_squad_formulas(pred: str, golds: list[str]) -> None:
    assert normalize_answer(pred) == squad_normalize(pred)
    assert exact_match(pred, golds) == max(reference_em(pred, g) for g in golds)
    assert f1(pred, golds) == pytest.approx(max(reference_f1_raw_aware(pred, g) for g in golds))
    if all(squad_normalize(g) for g in golds):  # the official formulas exactly
        assert exact_match(pred, golds) == max(squad_em(pred, g) for g in golds)
        assert f1(pred, golds) == pytest.approx(max(reference_f1(pred, g) for g in golds))


def test_scorers_read_the_last_answer_tag() -> None:
    response = "<think>maybe <answer>London</answer>?</think> <answer> Paris </answer>"
    assert extract_tagged_answer(response) == "Paris"
    result = qa_em_scorer(response, {"target": ["paris", "Paris, France"]})
    assert result.score == 1.0 and result.extracted == "Paris"
    assert result.components == {"em": 1.0, "f1": 1.0, "sub_em": 1.0}
    partial = qa_f1_scorer("<answer>the city of Paris</answer>", ["Paris"])
    assert partial.score == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))  # tokens: city of paris -> P=1/3, R=1
    assert partial.components["em"] == 0.0


def test_no_answer_tag_scores_zero_unless_fallback_requested() -> None:
    missing = qa_em_scorer("Paris", ["Paris"])
    assert missing.score == 0.0 and "no <answer>" in missing.details["reason"]
    assert qa_em_scorer("Paris", ["Paris"], extra_info={"fallback_to_text": True}).score == 1.0
    bad = qa_em_scorer("<answer>x</answer>", {"wrong": 1})
    assert bad.score == 0.0 and bad.error is not None and "target" in bad.error


# --- veRL's answer-tag spam penalty (verl/utils/reward_score/search_r1_like_qa_em.py), as an option ---
def verl_search_r1_em(solution: str, targets: list[str]) -> float:
    """veRL's rule, written out: last <answer> (DOTALL), SQuAD EM; a correct answer with more than 10 opening or
    closing tags scores 1/4."""
    matches = re.findall(r"<answer>(.*?)</answer>", solution, re.DOTALL)
    if not matches:
        return 0.0
    if not any(squad_normalize(matches[-1].strip()) == squad_normalize(t) for t in targets):
        return 0.0
    spam = solution.count("<answer>") > 10 or solution.count("</answer>") > 10
    return 0.25 if spam else 1.0


VERL = {"max_answer_tags": 10}


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<answer>x</answer>" * 10 + "<answer>Paris</answer>", 0.25),  # 11 pairs: a quarter
        ("<answer>x</answer>" * 9 + "<answer>Paris</answer>", 1.0),  # exactly 10 is allowed
        ("<answer>Paris</answer>" + "</answer>" * 10, 0.25),  # 11 closing tags alone count
        ("<answer>x" * 10 + "</answer><answer>Paris</answer>", 0.25),  # 11 opening tags alone count
        ("<answer>x</answer>" * 10 + "<answer>Rome</answer>", 0.0),  # wrong stays 0
    ],
)
def test_answer_tag_spam_penalty_by_hand(response: str, expected: float) -> None:
    result = qa_em_scorer(response, {"target": ["Paris"]}, extra_info=VERL)
    assert result.score == expected
    assert result.score == verl_search_r1_em(response, ["Paris"])
    assert result.components["em"] == (1.0 if expected > 0 else 0.0)  # the components stay unpenalised
    assert ("answer-tag spam" in result.details.get("reason", "")) is (expected == 0.25)


def test_answer_tag_spam_penalty_is_off_by_default() -> None:
    spam = "<answer>x</answer>" * 10 + "<answer>Paris</answer>"
    assert qa_em_scorer(spam, ["Paris"]).score == 1.0


def test_answer_tag_spam_penalty_scales_f1_and_takes_a_factor() -> None:
    spam = "<answer>x</answer>" * 11 + "<answer>Paris France</answer>"
    assert qa_f1_scorer(spam, ["Paris"], extra_info=VERL).score == pytest.approx(2 / 3 * 0.25)
    assert qa_em_scorer(spam, ["Paris France"], extra_info={"max_answer_tags": 3, "tag_spam_factor": 0}).score == 0.0
    assert qa_em_scorer(spam, ["Paris France"], extra_info={"max_answer_tags": 12}).score == 1.0


@pytest.mark.parametrize(
    ("extra_info", "field"),
    [
        ({"max_answer_tags": 0}, "max_answer_tags"),
        ({"max_answer_tags": "10"}, "max_answer_tags"),
        ({"max_answer_tags": True}, "max_answer_tags"),
        ({"max_answer_tags": 10, "tag_spam_factor": 1.5}, "tag_spam_factor"),
        ({"tag_spam_factor": 0.25}, "max_answer_tags"),
    ],
)
def test_bad_tag_spam_options_name_the_field(extra_info: dict[str, object], field: str) -> None:
    result = qa_em_scorer("<answer>Paris</answer>", ["Paris"], extra_info=extra_info)
    assert result.score == 0.0 and result.error is not None and field in result.error


_TAGGED = st.lists(
    st.sampled_from(["<answer>", "</answer>", "Paris", "Rome", " the ", "x", "\n"]), min_size=0, max_size=40
).map("".join)


@settings(max_examples=300, deadline=None)
@given(response=_TAGGED)
def test_tag_spam_penalty_matches_verl(response: str) -> None:
    assert qa_em_scorer(response, {"target": ["Paris"]}, extra_info=VERL).score == verl_search_r1_em(
        response, ["Paris"]
    )
