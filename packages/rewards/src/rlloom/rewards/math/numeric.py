"""Exact rational evaluation of plain numeric answers: the fast path that needs no SymPy.

Handles integers, decimals, scientific notation (`1.5e3`, `1.5\\times10^{3}`), `a/b`, `\\frac{a}{b}`, mixed
numbers (`2\\frac{1}{2}`), `+ - * / ^ !` and parentheses, all in `fractions.Fraction`, so `1/2^{99}` and
`1/2^{98}` stay different (float graders call them equal). Powers and factorials are bounded before they are
computed; an answer beyond the bounds is "not numeric here" and goes to the guarded symbolic path instead.

A decimal literal (`0.00463`) and an exact value (`1/216`) are equal only when the decimal is the exact value
written to the precision the decimal shows: within half a unit of its last digit (`|x - v| <= 5 * 10^-(d+1)`
for `d` digits after the point, ties included, so both roundings of a midpoint count), and showing at least
`MIN_SIGNIFICANT` significant digits (counted from the first nonzero digit to the last digit written, trailing
zeros included: `0.00463` has 3, `3.140` has 4, `0.00` has none). Against a value that is not rational (pi, a
radical, e) the caller asks for `MIN_SIGNIFICANT_IRRATIONAL`. A decimal written as continuing (`3.1415...`) may
also be the value truncated to its digits.

The scorer's `precision` knob (`score(..., precision=2)`, `extra_info["precision"]`) replaces `MIN_SIGNIFICANT`
for one call, and the digits asked against an irrational gold move with it (`irrational_digits`). It exists for
graders that state their own tolerance, as Math-Verify's tests pass `precision=2` for `0.33` against 1/3; a
reward should keep the default.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from rlloom.rewards.math.forms import continued_value

MAX_EXPONENT = 4096
MAX_FACTORIAL = 1000
MAX_BITS = 20_000
# A decimal must show this many significant digits to stand for an exact value: `0.00` is not 1/216, `0.33` is
# not 1/3 (two digits), `0.00463` is 1/216 and `0.333` is 1/3.
MIN_SIGNIFICANT = 3
# Against pi, a radical or e, one more: `3.14`, `1.41`, `1.73` and `2.72` are the stock three-digit values a
# policy can write without deriving the closed form the problem asks for; `3.142` and `1.414` are not.
MIN_SIGNIFICANT_IRRATIONAL = 4
_TOKEN_RE = re.compile(r"\s*(\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|\\frac|\\cdot|\\times|\\div|[-+*/^!(){}])")
_PLAIN_DECIMAL_RE = re.compile(r"^[-+]?(\d*)\.(\d+)(\\ldots)?$")
# `2\frac{1}{2}` and `2 \frac{1}{2}` (as Math-Verify's parser reads both) and `2 1/2` are mixed numbers
_MIXED_RE = re.compile(r"^(-?)(\d+)(?: ?\\frac\{(\d+)\}\{(\d+)\}| (\d+)/(\d+))$")


class _NotNumericError(Exception):
    """The text is not a bounded numeric expression."""


@dataclass(frozen=True)
class Number:
    """An exact value; `decimals` is the digit count after the point when the answer is a bare decimal literal,
    and `continued` says that literal was written as going on (`3.1415\\ldots`: its digits may be truncated)."""

    value: Fraction
    decimals: int | None = None
    continued: bool = False

    @property
    def significant(self) -> int:
        """Significant digits a decimal literal shows (`0.00463` -> 3, `3.140` -> 4, `0.00` -> 0)."""
        if self.decimals is None:
            return 0
        digits = abs(self.value) * 10**self.decimals
        return len(str(int(digits))) if digits else 0


def _check(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > MAX_BITS or value.denominator.bit_length() > MAX_BITS:
        raise _NotNumericError("too large")
    return value


class _Parser:
    """Recursive descent over tokens: expr := term (+|- term)*, term := unary ((*|/) unary)*, ..."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise _NotNumericError(f"expected {expected!r}")
        self.pos += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = _check(value + rhs if op == "+" else value - rhs)
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/", "\\cdot", "\\times", "\\div"):
            op = self.take()
            rhs = self.unary()
            if op in ("/", "\\div"):
                if rhs == 0:
                    raise _NotNumericError("division by zero")
                value = _check(value / rhs)
            else:
                value = _check(value * rhs)
        return value

    def unary(self) -> Fraction:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        if self.peek() == "+":
            self.take()
            return self.unary()
        return self.power()

    def power(self) -> Fraction:
        base = self.postfix()
        if self.peek() == "^":
            self.take()
            exponent = self.unary_atom_for_exponent()
            if exponent.denominator != 1 or abs(exponent.numerator) > MAX_EXPONENT:
                raise _NotNumericError("exponent not a small integer")
            if base == 0 and exponent < 0:
                raise _NotNumericError("zero to a negative power")
            bits = max(base.numerator.bit_length(), base.denominator.bit_length())
            if bits * abs(exponent.numerator) > MAX_BITS:
                raise _NotNumericError("power too large")
            return _check(base ** int(exponent))
        return base

    def unary_atom_for_exponent(self) -> Fraction:
        if self.peek() == "-":
            self.take()
            return -self.postfix()
        return self.postfix()

    def postfix(self) -> Fraction:
        value = self.atom()
        while self.peek() == "!":
            self.take()
            if value.denominator != 1 or not 0 <= value.numerator <= MAX_FACTORIAL:
                raise _NotNumericError("factorial out of range")
            value = Fraction(math.factorial(value.numerator))
        return value

    def atom(self) -> Fraction:
        tok = self.take()
        if tok in ("(", "{"):
            value = self.expr()
            self.take(")" if tok == "(" else "}")
            return value
        if tok == "\\frac":
            self.take("{")
            num = self.expr()
            self.take("}")
            self.take("{")
            den = self.expr()
            self.take("}")
            if den == 0:
                raise _NotNumericError("division by zero")
            return _check(num / den)
        if tok[0].isdigit() or tok[0] == ".":
            if "e" in tok.lower():
                mantissa, _, exp = tok.lower().partition("e")
                if abs(int(exp)) > MAX_EXPONENT:
                    raise _NotNumericError("exponent too large")
                return _check(Fraction(mantissa) * Fraction(10) ** int(exp))
            return Fraction(tok)
        raise _NotNumericError(f"unexpected {tok!r}")


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m:
            raise _NotNumericError(f"cannot read {text[pos : pos + 10]!r}")
        tokens.append(m.group(1))
        pos = m.end()
    return tokens


def parse_number(text: str) -> Number | None:
    """The exact value of a numeric answer (already normalised), or None if it is not a bounded number."""
    if not text or len(text) > 400:
        return None
    decimal = _PLAIN_DECIMAL_RE.match(text)
    if decimal:
        continued = decimal.group(3) is not None
        literal = text.removesuffix("\\ldots") if continued else text
        return Number(Fraction(literal), decimals=len(decimal.group(2)), continued=continued)
    mixed = _MIXED_RE.match(text)
    if mixed:
        sign, whole, n1, d1, n2, d2 = mixed.groups()
        num, den = (int(n1), int(d1)) if n1 is not None else (int(n2), int(d2))
        if den == 0:
            return None
        value = int(whole) + Fraction(num, den)
        return Number(-value if sign else value)
    try:
        tokens = _tokenize(text)
        parser = _Parser(tokens)
        value = parser.expr()
        if parser.pos != len(tokens):
            return None
        return Number(value)
    except (_NotNumericError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None


def approximates(approx: Number, exact: Fraction, *, min_significant: int = MIN_SIGNIFICANT) -> bool:
    """Whether decimal literal `approx` is `exact` written to the precision `approx` shows (see the module doc).

    `approx` must show at least `min_significant` significant digits and lie within half a unit of its last digit
    of `exact`: `0.00463` is 1/216 (|0.00463 - 0.0046296| <= 0.000005), `0.00` and `0.0046` are not, `0.667` is
    2/3 but the truncation `0.666` is not (it is 0.00067 off, more than 0.0005). A literal written as continuing
    (`0.1666\\ldots`, `3.1415\\ldots`) may also be the truncation. A zero literal (`0.000`) shows no significant
    digit, so it never stands for a nonzero value.
    """
    if approx.decimals is None or approx.significant < min_significant:
        return False
    scale = 10**approx.decimals
    if abs(approx.value - exact) * 2 * scale <= 1:
        return True
    return approx.continued and approx.value == Fraction(math.trunc(exact * scale), scale)


def repeating_reading(approx: Number) -> Fraction | None:
    """What a continued literal means as a repeating decimal: `0.1666\\ldots` is 1/6; None when its digits show no
    repeated block (`3.1415\\ldots`) or it is not a continued literal."""
    if not approx.continued or approx.decimals is None:
        return None
    scaled = abs(approx.value) * 10**approx.decimals
    whole, digits = divmod(int(scaled), 10**approx.decimals)
    value = continued_value(str(whole), str(digits).zfill(approx.decimals))
    return None if value is None else (-value if approx.value < 0 else value)


def numbers_match(a: Number, b: Number, *, min_significant: int = MIN_SIGNIFICANT) -> bool:
    """Exact equality, or a decimal literal that is the other, exact value written to the precision it shows.

    Two decimal literals must be equal exactly (2 vs 2.0001 is wrong; 3.14 vs 3.14159 too). A decimal `0.333`
    matches 1/3 (three significant digits, within 0.0005); `0.33` does not (two digits) unless the caller lowers
    `min_significant` to 2. A continued literal whose digits repeat is that repeating decimal, exactly:
    `0.0833\\ldots` is 1/12.
    """
    if a.value == b.value:
        return True
    if a.decimals is not None and b.decimals is None:
        return repeating_reading(a) == b.value or approximates(a, b.value, min_significant=min_significant)
    if b.decimals is not None and a.decimals is None:
        return repeating_reading(b) == a.value or approximates(b, a.value, min_significant=min_significant)
    return False


def check_precision(precision: object) -> int:
    """`precision` (the significant digits a rounded decimal must show to match an exact gold) as an int >= 1,
    or a ValueError naming the field and the fix."""
    if isinstance(precision, bool) or not isinstance(precision, int) or precision < 1:
        raise ValueError(
            f"precision must be a whole number of significant digits >= 1 (default {MIN_SIGNIFICANT}), "
            f"got {precision!r}"
        )
    return precision


def irrational_digits(precision: int) -> int:
    """Digits asked of a decimal against pi, a radical or e: one more than against a rational gold."""
    return precision + MIN_SIGNIFICANT_IRRATIONAL - MIN_SIGNIFICANT
