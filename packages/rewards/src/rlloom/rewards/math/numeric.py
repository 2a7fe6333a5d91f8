"""Exact rational evaluation of plain numeric answers: the fast path that needs no SymPy.

Handles integers, decimals, scientific notation (`1.5e3`, `1.5\\times10^{3}`), `a/b`, `\\frac{a}{b}`, mixed
numbers (`2\\frac{1}{2}`), `+ - * / ^ !` and parentheses, all in `fractions.Fraction`, so `1/2^{99}` and
`1/2^{98}` stay different (float graders call them equal). Powers and factorials are bounded before they are
computed; an answer beyond the bounds is "not numeric here" and goes to the guarded symbolic path instead.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

MAX_EXPONENT = 4096
MAX_FACTORIAL = 1000
MAX_BITS = 20_000
_TOKEN_RE = re.compile(r"\s*(\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|\\frac|\\cdot|\\times|\\div|[-+*/^!(){}])")
_PLAIN_DECIMAL_RE = re.compile(r"^[-+]?(\d*)\.(\d+)$")
# `2\frac{1}{2}` and `2 \frac{1}{2}` (as Math-Verify's parser reads both) and `2 1/2` are mixed numbers
_MIXED_RE = re.compile(r"^(-?)(\d+)(?: ?\\frac\{(\d+)\}\{(\d+)\}| (\d+)/(\d+))$")


class _NotNumericError(Exception):
    """The text is not a bounded numeric expression."""


@dataclass(frozen=True)
class Number:
    """An exact value; `decimals` is the digit count after the point when the answer is a bare decimal literal."""

    value: Fraction
    decimals: int | None = None


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
        return Number(Fraction(text), decimals=len(decimal.group(2)))
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


def approximates(approx: Number, exact: Fraction) -> bool:
    """Whether decimal literal `approx` (>= 2 digits after the point) is `exact` rounded or truncated to its digits.

    Rounding and truncation are the two ways people shorten a value; anything else (3.15 for pi) is wrong.
    """
    if approx.decimals is None or approx.decimals < 2:
        return False
    scale = 10**approx.decimals
    scaled = exact * scale
    if scaled.denominator == 1:
        return False  # the exact value has a decimal form of this length, so a different literal is just wrong
    truncated = Fraction(math.trunc(scaled), scale)
    rounded = Fraction(math.floor(scaled + Fraction(1, 2)), scale)
    return approx.value in (truncated, rounded)


def numbers_match(a: Number, b: Number) -> bool:
    """Exact equality, or a decimal literal with >= 2 digits that rounds or truncates the other exact value.

    Two decimal literals must be equal exactly (2 vs 2.0001 is wrong). A decimal `0.333` matches 1/3 because
    it is 1/3 truncated to the digits written.
    """
    if a.value == b.value:
        return True
    if a.decimals is not None and b.decimals is None:
        return approximates(a, b.value)
    if b.decimals is not None and a.decimals is None:
        return approximates(b, a.value)
    return False
