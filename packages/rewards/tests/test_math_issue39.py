"""Issue 39, math: each class of false credit or refused honest answer, as hostile cases refused and honest twins
accepted. Every expectation is computed by hand in the comment beside it.

Classes: a rounded decimal against an exact gold (precision and significant digits), different units, repeating
decimals, number words, written-out infinity, option letters written without a box.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from rlloom.rewards.math import compare, is_equivalent, math_scorer, score
from rlloom.rewards.math.equivalence import Verdict
from rlloom.rewards.math.extract import extract_choice
from rlloom.rewards.math.normalize import normalize, stated_choice, unit_key
from rlloom.rewards.math.numeric import Number, approximates, parse_number

# SymPy cases (ln 2, e) get a generous budget: these check verdicts, and a loaded CI machine must not time out.
TIMEOUT = 30.0

# ---------------------------------------------------------------- decimals against an exact gold


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("0.00", "\\frac{1}{216}"),  # 1/216 = 0.0046296...: rounds to 0.00, but 0.00 shows no significant digit
        ("0.0046", "\\frac{1}{216}"),  # within 0.00005 (|0.0046 - 0.00463| = 0.00003), but 2 significant digits
        ("0.33", "\\frac{1}{3}"),  # 2 significant digits
        ("0.666", "\\frac{2}{3}"),  # the truncation: |0.666 - 0.6667| = 0.00067 > half a unit (0.0005)
        ("0.0314", "\\frac{1}{32}"),  # 1/32 = 0.03125: |0.0314 - 0.03125| = 0.00015 > 0.00005
        ("3.14", "\\pi"),  # 3 significant digits against pi, which needs 4
        ("1.41", "\\sqrt{2}"),  # likewise for a radical
        ("3.1415", "\\pi"),  # pi = 3.1415926...: |3.1415 - pi| = 0.0000927 > 0.00005 (a truncation, not marked)
        ("2.72", "e"),  # 3 significant digits against e (SymPy path)
        ("0.693", "\\ln 2"),  # ln 2 = 0.693147...: within 0.0005, but 3 digits against an irrational (SymPy path)
        ("0.000", "\\frac{1}{5000}"),  # a zero literal never stands for a nonzero value
        ("1/3", "0.33"),  # the same rule whichever side the decimal is on
    ],
)
def test_a_decimal_short_of_the_precision_rule_earns_nothing(pred: str, gold: str) -> None:
    assert not compare(pred, gold, timeout=TIMEOUT).equal


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("0.00463", "\\frac{1}{216}"),  # 3 significant digits; |0.00463 - 0.0046296| = 0.00000037 <= 0.000005
        ("0.333", "\\frac{1}{3}"),  # |0.333 - 1/3| = 0.00033 <= 0.0005
        ("0.667", "\\frac{2}{3}"),  # the rounding: |0.667 - 2/3| = 0.00033 <= 0.0005
        ("0.0313", "\\frac{1}{32}"),  # 0.03125 is a midpoint: 0.00005 off either way, both roundings count
        ("0.0312", "\\frac{1}{32}"),
        ("142.9", "\\frac{1000}{7}"),  # 142.857...: 4 significant digits, |142.9 - 142.857| = 0.043 <= 0.05
        ("3.142", "\\pi"),  # 4 significant digits; |3.142 - 3.14159| = 0.00041 <= 0.0005
        ("1.414", "\\sqrt{2}"),  # |1.414 - 1.41421| = 0.00021 <= 0.0005
        ("3.1415...", "\\pi"),  # written as going on: the truncation of pi to 4 decimals counts
        ("2.718", "e"),  # |2.718 - 2.71828| = 0.00028 <= 0.0005 (SymPy path)
        ("0.6931", "\\ln 2"),  # |0.6931 - 0.693147| = 0.000047 <= 0.00005 (SymPy path)
        ("\\frac{1}{3}", "0.333"),  # an exact answer against a decimal gold: the same rule
    ],
)
def test_a_decimal_to_the_precision_it_shows_is_the_value(pred: str, gold: str) -> None:
    assert compare(pred, gold, timeout=TIMEOUT).equal


def test_the_precision_rule_as_arithmetic() -> None:
    # significant digits run from the first nonzero digit to the last one written, trailing zeros included
    assert [parse_number(t).significant for t in ("0.00463", "3.140", "0.00", "12.5", "-0.050")] == [3, 4, 0, 3, 2]
    third = Fraction(1, 3)
    assert approximates(Number(Fraction("0.333"), 3), third)
    assert not approximates(Number(Fraction("0.333"), 3), third, min_significant=4)
    # half a unit of the last digit, inclusive: 0.125 is 0.005 from both 0.12 and 0.13
    assert approximates(Number(Fraction("0.12"), 2), Fraction(1, 8), min_significant=2)
    assert approximates(Number(Fraction("0.13"), 2), Fraction(1, 8), min_significant=2)
    assert not approximates(Number(Fraction("0.11"), 2), Fraction(1, 8), min_significant=2)


def test_a_decimal_in_a_response_is_scored_by_the_same_rule() -> None:
    assert score("The probability is $\\boxed{0.00}$.", "\\frac{1}{216}") == 0.0
    assert score("The probability is $\\boxed{0.00463}$.", "\\frac{1}{216}") == 1.0
    assert score("So the area is \\boxed{3.14}.", "\\pi") == 0.0
    assert score("So the area is \\boxed{3.1416}.", "\\pi") == 1.0  # |3.1416 - pi| = 0.0000073


def test_the_precision_knob_lowers_or_raises_the_digits_asked() -> None:
    """`precision` is the significant digits a rounded decimal must show; the default stays 3 (so the rule above
    holds for every caller that does not ask), and against pi, a radical or e it asks one more."""
    third = "\\frac{1}{3}"
    assert score("\\boxed{0.33}", third) == 0.0  # default: 2 digits shown, 3 asked
    assert score("\\boxed{0.33}", third, precision=2) == 1.0  # |0.33 - 1/3| = 0.0033 <= 0.005
    assert score("\\boxed{0.3}", third, precision=2) == 0.0  # one digit shown, two asked
    assert score("\\boxed{0.34}", third, precision=2) == 0.0  # 0.0067 off, more than half a unit (0.005)
    assert score("\\boxed{0.333}", third, precision=4) == 0.0  # three digits shown, four asked
    assert score("\\boxed{0.00}", "\\frac{1}{216}", precision=1) == 0.0  # a zero shows no digit at all
    assert is_equivalent("3.14", "\\pi", precision=2) and not is_equivalent("3.14", "\\pi")  # 3 asked, then 4
    # against a radical: sqrt(2)/2 = 0.7071...; 0.707 shows 3 digits, 4 asked (3 with precision=2)
    assert not is_equivalent("0.707", "\\frac{\\sqrt{2}}{2}", timeout=TIMEOUT)
    assert is_equivalent("0.707", "\\frac{\\sqrt{2}}{2}", timeout=TIMEOUT, precision=2)
    # the SymPy worker reads the same knob: sin(pi/6) / (3/2) is 1/3 only once SymPy simplifies it
    sympy_third = "\\frac{\\sin(\\pi/6)}{3/2}"
    assert compare("0.33", sympy_third, timeout=TIMEOUT) == Verdict(False, "sympy expression")
    assert compare("0.33", sympy_third, timeout=TIMEOUT, precision=2) == Verdict(True, "sympy expression")


def test_the_precision_knob_through_extra_info_and_its_errors() -> None:
    assert math_scorer("\\boxed{0.33}", "1/3", extra_info={"precision": 2}).score == 1.0
    assert math_scorer("\\boxed{0.33}", "1/3").score == 0.0
    for bad in (0, -1, 2.5, "2", True):
        result = math_scorer("\\boxed{0.33}", "1/3", extra_info={"precision": bad})
        assert result.score == 0.0 and result.error is not None and result.error.startswith("precision must be")
        with pytest.raises(ValueError, match="precision must be a whole number"):
            score("0.33", "1/3", precision=bad)  # type: ignore[arg-type]


def test_two_decimals_still_compare_exactly() -> None:
    assert not is_equivalent("3.14", "3.14159") and not is_equivalent("2.0001", "2")
    assert is_equivalent("2.50", "2.5")


# ---------------------------------------------------------------- units


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("5\\text{ cm}", "5\\text{ m}"),
        ("5 cm", "5 meters"),
        ("500 cm", "5\\text{ m}"),  # the same length, but different units never match
        ("5\\text{ m}^2", "5\\text{ m}"),  # an area is not a length
        ("5 dollars", "5 cents"),
        ("\\$5", "5 cents"),
        ("60 mph", "60 km/h"),
        ("3 hours", "3 minutes"),
    ],
)
def test_different_units_never_match(pred: str, gold: str) -> None:
    verdict = compare(pred, gold)
    assert not verdict.equal and verdict.reason.startswith("different units"), verdict


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("5 meters", "5\\text{ m}"),  # one unit, two spellings
        ("5\\,\\text{m}^2", "5 square meters"),
        ("5 cm", "5"),  # a unit on one side only: the number decides, as before
        ("5", "5\\text{ cm}"),
        ("\\$5", "5 dollars"),
        ("5 apples", "5 people"),  # counted nouns are not units
        ("12\\text{ cm}^2", "12 square units"),  # "units" names no unit
    ],
)
def test_the_same_unit_or_one_unit_written_matches(pred: str, gold: str) -> None:
    assert compare(pred, gold).equal


def test_unit_names_are_canonical() -> None:
    assert unit_key(" centimetres") == unit_key("\\text{ cm}") == "cm"
    assert unit_key(" square meters") == unit_key("\\text{m}^2") == "m^2"
    assert unit_key(" apples") is None and unit_key(" square units") is None
    assert normalize("$125$ miles").unit == "mi"  # a bare `$` is a math delimiter, not a dollar


def test_a_response_with_the_wrong_unit_earns_nothing() -> None:
    assert score("The rope is $\\boxed{5\\text{ cm}}$ long.", "5\\text{ m}") == 0.0
    assert score("The rope is $\\boxed{5\\text{ m}}$ long.", "5\\text{ m}") == 1.0


# ---------------------------------------------------------------- repeating decimals


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("0.\\overline{3}", "\\frac{1}{3}"),  # 3/9
        ("0.\\bar{3}", "\\frac{1}{3}"),
        ("0.(3)", "\\frac{1}{3}"),
        ("0.\\dot{3}", "\\frac{1}{3}"),
        ("0.1\\overline{6}", "\\frac{1}{6}"),  # 0.1 + 6/90 = 9/90 + 6/90 = 15/90
        ("0.1(6)", "\\frac{1}{6}"),
        ("0.1\\dot{6}", "\\frac{1}{6}"),
        ("0.\\overline{142857}", "\\frac{1}{7}"),  # 142857/999999
        ("0.\\dot{1}4285\\dot{7}", "\\frac{1}{7}"),  # dots over the first and last digit of the block
        ("1.\\overline{09}", "\\frac{12}{11}"),  # 1 + 9/99 = 1 + 1/11
        ("-0.\\overline{3}", "-\\frac{1}{3}"),
        ("0.\\overline{9}", "1"),  # 9/9
        ("0.0833...", "\\frac{1}{12}"),  # digits end in "33": 0.08 + 3/900 = 72/900 + 3/900 = 75/900
        ("0.1666\\ldots", "\\frac{1}{6}"),
        ("0.8333 repeating", "\\frac{5}{6}"),  # 0.8 + 3/90 = 75/90
    ],
)
def test_a_repeating_decimal_is_its_exact_value(pred: str, gold: str) -> None:
    assert compare(pred, gold).equal


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("0.\\overline{3}", "0.3"),  # 1/3 is not 3/10
        ("0.\\overline{3}", "\\frac{33}{100}"),
        ("0.(3)", "\\frac{3}{10}"),
        ("0.1\\overline{6}", "\\frac{1}{7}"),
        ("0.\\overline{142857}", "\\frac{1}{6}"),
        ("0.3...", "\\frac{1}{3}"),  # one digit, no repeated block: 0.3 rounded or truncated, 1 significant digit
        ("0.\\overline{9}", "0.9"),
    ],
)
def test_a_repeating_decimal_is_not_a_nearby_value(pred: str, gold: str) -> None:
    assert not compare(pred, gold).equal


# ---------------------------------------------------------------- number words


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("twelve", "12"),
        ("Twelve.", "12"),
        ("\\text{twelve}", "12"),
        ("one hundred and five", "105"),
        ("one hundred five", "105"),
        ("twenty-one", "21"),
        ("a thousand", "1000"),
        ("two million three hundred thousand", "2300000"),
        ("negative seven", "-7"),
        ("three quarters", "\\frac{3}{4}"),
        ("two thirds", "\\frac{2}{3}"),
        ("one and a half", "\\frac{3}{2}"),
        ("twelve apples", "12"),  # a counted noun after the number, dropped as after digits
        ("5", "\\text{five}"),  # a gold in words
    ],
)
def test_number_words_are_read(pred: str, gold: str) -> None:
    assert compare(pred, gold).equal


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("twelve", "13"),
        ("one hundred and five", "100"),
        ("one or two", "1"),  # a hedge, not a number
        ("twelve and thirteen", "12"),
        ("five five", "5"),  # not a well-formed number
        ("five five", "55"),
        ("first", "1"),  # an ordinal is not a count
        ("second", "2"),
        ("three quarters", "\\frac{3}{5}"),
    ],
)
def test_number_words_are_not_stray_numbers(pred: str, gold: str) -> None:
    assert not compare(pred, gold).equal


def test_a_number_in_words_in_a_response() -> None:
    assert score("The answer is twelve.", "12") == 1.0
    assert score("The answer is thirteen.", "12") == 0.0


# ---------------------------------------------------------------- infinity in words


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("infinity", "\\infty"),
        ("Infinity", "\\infty"),
        ("\\text{infinity}", "\\infty"),
        ("positive infinity", "\\infty"),
        ("negative infinity", "-\\infty"),
        ("minus infinity", "-\\infty"),
        ("-infinity", "-\\infty"),
        ("(-infinity, 3)", "(-\\infty, 3)"),
    ],
)
def test_infinity_written_out_is_read(pred: str, gold: str) -> None:
    assert compare(pred, gold).equal


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("infinity", "-\\infty"),
        ("negative infinity", "\\infty"),
        ("infinitely many", "\\infty"),  # another word
        ("(-infinity, 3]", "(-\\infty, 3)"),
    ],
)
def test_infinity_written_out_keeps_its_sign_and_brackets(pred: str, gold: str) -> None:
    assert not compare(pred, gold).equal


# ---------------------------------------------------------------- option letters without a box


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("The answer is (B).", "B"),
        ("Answer: C", "C"),
        ("**Answer:** B", "B"),
        ("Answer: **B**", "B"),
        ("The answer is B because it is larger.", "B"),
        ("The answer is B, since A is too small.", "B"),  # "A is": an article's shape, not a second option
        ("The correct option is (C), since x = 12.", "C"),  # a statement about the option, then a number
        ("Final answer: (D) 12", "D"),
        ("The answer is $\\textbf{(B)}$.", "B"),
        ("Answer: B) 12", "B"),
        ("so the answer is option C", "C"),
        ("The answer is I", "I"),
    ],
)
def test_an_unboxed_option_letter_is_read(response: str, gold: str) -> None:
    assert score(response, gold) == 1.0


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("The answer is A good deal of work.", "A"),  # "A" starts a sentence
        ("Answer: I think it is B", "I"),  # "I" is the pronoun
        ("Answer: I think it is B", "B"),  # the letter is inside prose, after no marker
        ("The answer is B or C.", "B"),  # a hedge
        ("The answer is B or C.", "C"),
        ("Answer: (B), (C)", "B"),
        ("The answer is (B) or (C).", "B"),  # "(B) 12" is a letter and its option's value; "(B) or (C)" is two
        ("Answer: (B) and (D)", "D"),
        ("The answer is B, not A.", "B"),  # a second option named: refused rather than guessed
        ("In triangle ABC, point B is the midpoint, so x = 12.", "B"),  # letters in prose, no answer marker
        ("Option B is wrong, so the answer is 12.", "B"),
        ("The correct option is not (B). So x = 12", "B"),
        ("I think (B) is right.", "B"),  # no answer marker
        ("\\boxed{12}. The correct option is (B).", "B"),  # a box is the final answer
        ("The answer is (C).", "B"),
    ],
)
def test_a_stray_or_hedged_letter_earns_nothing(response: str, gold: str) -> None:
    assert score(response, gold) == 0.0


def test_stated_choice_and_extract_choice() -> None:
    assert [stated_choice(s) for s in ("B", "(B)", "**B**", "B, since", "B because", "B) 12")] == ["B"] * 6
    assert [stated_choice(s) for s in ("A lot", "I think", "not B", "B or C", "(B), (C)", "B C")] == [None] * 6
    # only the last statement counts
    assert extract_choice("The correct option is (B). Wait, the correct option is (C).") == "(C)"
    assert extract_choice("The correct option is (B). Actually the correct option is not obvious.") is None


def test_letter_golds_with_choices_still_accept_the_text() -> None:
    info = {"choices": ["30", "40", "60", "80"]}
    assert math_scorer("The correct option is (D).", "D", extra_info=info).score == 1.0
    assert math_scorer("The answer is 80.", "D", extra_info=info).score == 1.0
    assert math_scorer("The answer is 60.", "D", extra_info=info).score == 0.0
