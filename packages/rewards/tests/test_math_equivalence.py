"""is_equivalent / compare: hand-labelled pairs per category (positive and negative), plus targeted rules.

The bulk of the cases live in data/math_handlabelled.jsonl, each with the reason for its label written by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlloom.rewards.math import compare, is_equivalent, math_scorer, score

DATA = Path(__file__).parent / "data"


def _rows(name: str) -> list[dict[str, Any]]:
    with (DATA / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


HAND = _rows("math_handlabelled.jsonl")


def test_handlabelled_set_is_big_and_covers_both_labels() -> None:
    assert len(HAND) >= 60
    for category in {r["category"] for r in HAND if r["category"] != "extraction"}:
        labels = {r["label"] for r in HAND if r["category"] == category}
        assert labels, category
    assert sum(r["label"] for r in HAND) > 20 and sum(not r["label"] for r in HAND) > 20
    assert all(r["reason"] for r in HAND)


@pytest.mark.parametrize("row", HAND, ids=[f"{r['id']}-{r['category']}" for r in HAND])
def test_handlabelled(row: dict[str, Any]) -> None:
    # A generous timeout: these check correctness; a loaded CI machine must not turn a SymPy case into a timeout.
    pair = "pred" in row
    got = (
        is_equivalent(row["pred"], row["gold"], timeout=30)
        if pair
        else score(row["response"], row["gold"], timeout=30) == 1.0
    )
    assert got is row["label"], row["reason"]


def test_gold_may_list_several_accepted_forms() -> None:
    assert is_equivalent("\\frac{\\pi}{2}", ["90", "\\frac{\\pi}{2}"])
    assert is_equivalent("90^\\circ", ["90", "\\frac{\\pi}{2}"])
    assert not is_equivalent("45", ["90", "\\frac{\\pi}{2}"])


def test_percent_is_read_one_way_only() -> None:
    # 10% may be meant as 10 or as 0.1; a bare 0.1 against a bare 10 is wrong.
    assert is_equivalent("10\\%", "0.1") and is_equivalent("0.1", "10\\%") and is_equivalent("10", "10\\%")
    assert not is_equivalent("0.1", "10") and not is_equivalent("1000\\%", "1")


def test_verdict_names_the_deciding_rule() -> None:
    assert compare("1/2", "0.5").reason == "exact numbers"
    assert compare("(1,2)", "[1,2]").reason == "ordered tuple"
    assert compare("\\sqrt{8}", "2\\sqrt{2}").reason == "numeric screen"
    assert compare("x^2+2x+1", "(x+1)^2").reason == "numeric screen"
    assert compare("\\sin^2 x + \\cos^2 x", "1").reason.startswith("sympy")


def test_tiny_different_numbers_stay_different() -> None:
    # Math-Verify's 6-digit float rounding calls these equal (its issue #14); exact rationals do not.
    assert not is_equivalent("10^{-7}", "2 \\times 10^{-7}")
    assert not is_equivalent("\\frac{1}{3^{40}}", "\\frac{1}{3^{41}}")
    assert is_equivalent("2^{-10}", "\\frac{1}{1024}")


def test_hendrycks_pairs() -> None:
    rows = _rows("math_hendrycks_pairs.jsonl")
    disagreements = [r for r in rows if is_equivalent(r["pred"], r["gold"]) is not r["is_correct"]]
    # Deliberate: a bare comma list is the MATH "all solutions" answer, so its order does not matter; the
    # hendrycks string checker labels reordered lists wrong. Everything else agrees.
    assert sorted(r["test_function"] for r in disagreements) == ["test_decimals", "test_order"]


def test_gsm8k_model_solutions_slice() -> None:
    rows = _rows("math_gsm8k_pairs_slice.jsonl")
    correct = sum((score(r["response"], r["gold"]) == 1.0) is r["is_correct"] for r in rows)
    assert correct / len(rows) >= 0.99


def test_math500_reference_solutions_score_one() -> None:
    # A reference solution must earn full reward against its own answer (gold self-consistency).
    rows = _rows("math_math500_slice.jsonl")
    failures = [r["unique_id"] for r in rows if score(r["solution"], r["answer"]) != 1.0]
    assert failures == []
    assert all(is_equivalent(r["answer"], r["answer"]) for r in rows)


def test_letter_gold_with_choices_accepts_the_option_text() -> None:
    # geometry3k: gold "D", choices ["30", "40", "60", "80"]; a model may answer the letter or the value.
    info = {"choices": ["30", "40", "60", "80"]}
    assert math_scorer("\\boxed{D}", "D", extra_info=info).score == 1.0
    assert math_scorer("\\boxed{80}", "D", extra_info=info).score == 1.0
    assert math_scorer("\\boxed{60}", "D", extra_info=info).score == 0.0
    assert math_scorer("\\boxed{C}", "D", extra_info=info).score == 0.0
    assert math_scorer("\\boxed{80}", "D").score == 0.0  # without choices a value cannot match a letter


@pytest.mark.parametrize(
    ("pred", "gold", "equal"),
    [
        ("4\\,\\text{m}^2", "4", True),  # thin space, unit symbol as text, unit power
        ("4\\;\\text{cm}^{3}", "4", True),
        ("4\\!\\text{ m}", "4", True),
        ("12\\,\\mathrm{s}.", "12", True),
        ("5\\,\\text{m}^2", "4", False),  # the number still decides
        ("4m^2", "4", False),  # bare m is a variable, not a unit
        ("4\\text{m}^4", "4", False),  # not a unit power
        ("\\mathbb{R}", "(-\\infty,\\infty)", True),
        ("(-\\infty, \\infty)", "\\mathbb{R}", True),
        ("x \\in \\mathbb{R}", "(-\\infty,\\infty)", True),
        ("\\mathbb{R}", "(0,\\infty)", False),
        ("\\mathbb{Z}", "(-\\infty,\\infty)", False),
    ],
)
def test_text_units_and_the_reals(pred: str, gold: str, equal: bool) -> None:
    assert compare(pred, gold).equal is equal
    assert math_scorer(f"so \\boxed{{{pred}}}", gold).score == float(equal)


@pytest.mark.parametrize("pred", ["\\frac{x}{0}", "x/0", "\\frac{x}{x-x}", "\\frac{x}{0} + 1"])
@pytest.mark.parametrize("gold", ["7", "\\frac{3}{4}", "x", "\\frac{y}{0}"])
def test_undefined_expressions_equal_nothing(pred: str, gold: str) -> None:
    # x/0 is NaN at every point; NaN compared as "no difference" would let one answer match every gold
    assert not is_equivalent(pred, gold, timeout=30)


@pytest.mark.parametrize(("pred", "gold"), [("2 \\frac{1}{2}", "2.5"), ("2\\ \\frac12", "\\frac{5}{2}"),
                                            ("-3 \\frac{1}{4}", "-3.25")])  # fmt: skip
def test_mixed_number_with_a_space_is_its_value(pred: str, gold: str) -> None:
    # Math-Verify reads `2 \frac{1}{2}` as 5/2, as `2\frac{1}{2}` already is here; never as the product 1
    assert is_equivalent(pred, gold, timeout=30)
    assert not is_equivalent("2 \\frac{1}{2}", "1", timeout=30)


@pytest.mark.parametrize(("pred", "gold", "equal"), [("x=2, x=-2", "2, -2", True), ("x=2, x=-2", "\\pm 2", True),
                                                     ("x = 1, y = 2", "(1, 2)", True), ("x=2, x=3", "2, -2", False),
                                                     ("x=1, y=2", "(2, 1)", False)])  # fmt: skip
def test_a_list_of_assignments_equals_the_list_of_values(pred: str, gold: str, equal: bool) -> None:
    # `x = 3` equals `3`, so "all solutions" written as equations equal the bare values (as Math-Verify judges)
    assert is_equivalent(pred, gold, timeout=30) is equal


def test_two_boxed_assignments_are_read_as_the_solution_set() -> None:
    assert math_scorer("so \\boxed{x=2} and \\boxed{x=-2}", "\\pm 2").score == 1.0


@pytest.mark.parametrize(("pred", "equal"), [("11111111100", True), ("11,111,111,100", True),
                                             ("11,\\!111,\\!111,\\!100", True), ("11111111101", False),
                                             ("100, 111, 111, 11", False)])  # fmt: skip
def test_thousands_comma_with_negative_thin_space_and_a_space(pred: str, equal: bool) -> None:
    # MATH-500 test/number_theory/417.json writes its gold as "11,\! 111,\! 111,\! 100": one number, not a list
    assert is_equivalent(pred, "11,\\! 111,\\! 111,\\! 100") is equal
    assert math_scorer(f"\\boxed{{{pred}}}", "11,\\! 111,\\! 111,\\! 100").score == float(equal)


@pytest.mark.parametrize(("pred", "gold", "equal"), [("x = (2,12) \\cup (12,102)", "(2,12) \\cup (12,102)", True),
                                                     ("x=[0,100]", "[0,100]", True), ("x=(0,100)", "[0,100]", False),
                                                     ("x = 1,000", "1000", True)])  # fmt: skip
def test_commas_inside_brackets_are_not_thousands_separators(pred: str, gold: str, equal: bool) -> None:
    # MATH-500 test/intermediate_algebra/1981.json: after "x =", "(12,102)" is still an interval, not (12102)
    assert is_equivalent(pred, gold, timeout=30) is equal
