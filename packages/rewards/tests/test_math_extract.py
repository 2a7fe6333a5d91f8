"""extract_answer: each mode on hand-written responses, with the expected span worked out by hand."""

from __future__ import annotations

import pytest

from rlloom.rewards.math import extract_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),  # nested braces
        ("first \\boxed{1}, long reasoning shows that is wrong, so \\boxed{2}", "2"),  # self-correction
        ("\\boxed{3} or \\boxed{4}", "3, 4"),  # a hedge stays visible as a two-item list
        ("\\boxed{2} and \\boxed{-3}", "2, -3"),
        ("\\fbox{7}", "7"),
        ("\\boxed 5 is it", "5"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces inside a box
        ("<answer>42</answer>", "42"),
        ("<answer>x</answer> then <answer>$\\boxed{9}$</answer>", "9"),
        ("Thus the answer is $\\frac{3}{5}$.", "\\frac{3}{5}"),
        ("Final Answer: The final answer is 3.5. I hope it is correct.", "3.5"),
        ("The answer is 2.5\nmore text", "2.5"),
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
        ("So she has 20 - 12 = 8 left.", "8"),
        ("A: 1,200", "1,200"),
    ],
)
def test_extract_answer_finds_the_final_answer(text: str, expected: str) -> None:
    assert extract_answer(text) == expected


def test_boxed_beats_answer_is() -> None:
    # The phrase at the end restates the boxed value in words; the box is the marked answer.
    assert extract_answer("\\boxed{1625}\nThe answer is One thousand six hundred twenty-five.") == "1625"


def test_modes_restrict_what_is_read() -> None:
    text = "We get 7 apples."
    assert extract_answer(text) == "7"
    assert extract_answer(text, modes=("boxed", "answer_is")) is None
    assert extract_answer("#### 5 \\boxed{6}", modes=("gsm8k",)) == "5 \\boxed{6}"


@pytest.mark.parametrize("text", ["", "no digits here", "\\boxed{", "\\boxed{}", "<answer></answer>"])
def test_nothing_to_extract_gives_none(text: str) -> None:
    assert extract_answer(text, modes=("boxed", "answer_tag", "answer_is", "gsm8k")) is None


def test_unknown_mode_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown modes.*boxed"):
        extract_answer("x", modes=("latex",))  # type: ignore[arg-type]
