"""Floating-point evaluation of small LaTeX expressions: the numeric screen that spares most SymPy calls.

Wrong answers are most answers early in RL, and two expressions that differ at a number (or at a random
point, for expressions in x, y, ...) are certainly different, so they are rejected here in microseconds.
Supported: numbers, `+ - * / ^`, implicit multiplication (`2\\sqrt{3}`, `3x`, `x(x+1)`), `\\frac`, `\\sqrt`,
`\\sqrt[n]`, `\\pi`, `i` (complex), `\\cdot`, `\\times`, parentheses and braces, single-letter variables.
Anything else (functions, `e`, sets, relations) returns None and is left to SymPy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

_TOKEN_RE = re.compile(r"\s*(\d+\.?\d*|\.\d+|\\frac|\\sqrt|\\pi|\\cdot|\\times|\\div|[a-df-zA-Z]|[-+*/^(){}\[\]])")
_MAX_MAGNITUDE = 1e12
POINTS: tuple[float, ...] = (0.7317, 1.3989, 2.2561)


class _CannotEvaluateError(Exception):
    """Outside the supported grammar, or not a finite moderate real number."""


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m:
            raise _CannotEvaluateError(text[pos : pos + 10])
        out.append(m.group(1))
        pos = m.end()
    return out


class _Evaluator:
    def __init__(self, tokens: list[str], values: Mapping[str, float]) -> None:
        self.tokens, self.values, self.pos = tokens, values, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise _CannotEvaluateError(f"expected {expected}")
        self.pos += 1
        return tok

    def expr(self) -> complex:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> complex:
        value = self.signed()
        while True:
            tok = self.peek()
            if tok in ("*", "\\cdot", "\\times"):
                self.take()
                value *= self.signed()
            elif tok in ("/", "\\div"):
                self.take()
                value /= _nonzero(self.signed())
            elif tok is not None and tok not in ("+", "-", ")", "}", "]", "^"):
                value *= self.power()  # implicit multiplication
            else:
                return value

    def signed(self) -> complex:
        if self.peek() == "-":
            self.take()
            return -self.signed()
        if self.peek() == "+":
            self.take()
        return self.power()

    def power(self) -> complex:
        base = self.atom()
        if self.peek() == "^":
            self.take()
            exponent = -self.atom() if self.peek() == "-" and self.take() else self.atom()
            if exponent.imag != 0 or (
                (base.imag != 0 or base.real < 0) and not (exponent.real.is_integer() and abs(exponent) < 64)
            ):
                raise _CannotEvaluateError("complex power")
            if base.imag == 0 and exponent.real.is_integer():
                base, exponent = base.real, exponent.real
            try:
                base = base**exponent
            except (OverflowError, ZeroDivisionError) as exc:
                raise _CannotEvaluateError("power") from exc
        return _finite(base)

    def atom(self) -> complex:
        tok = self.take()
        if tok in ("(", "{", "["):
            value = self.expr()
            self.take({"(": ")", "{": "}", "[": "]"}[tok])
            return value
        if tok == "\\frac":
            num = self.group()
            return num / _nonzero(self.group())
        if tok == "\\sqrt":
            index: complex = 2.0
            if self.peek() == "[":
                self.take()
                index = self.expr()
                self.take("]")
            radicand = self.group() if self.peek() == "{" else self.atom()
            if radicand.imag != 0 or index.imag != 0 or radicand.real < 0 or index == 0:
                raise _CannotEvaluateError("sqrt")
            return float(radicand.real ** (1.0 / index.real))
        if tok == "\\pi":
            return math.pi
        if tok == "i":
            return 1j
        if tok[0].isdigit() or tok[0] == ".":
            return float(tok)
        if tok in self.values:
            return self.values[tok]
        raise _CannotEvaluateError(tok)

    def group(self) -> complex:
        self.take("{")
        value = self.expr()
        self.take("}")
        return value


def _nonzero(value: complex) -> complex:
    if value == 0:
        raise _CannotEvaluateError("division by zero")
    return value


def _finite(value: complex) -> complex:
    if not (math.isfinite(value.real) and math.isfinite(value.imag)) or abs(value) > _MAX_MAGNITUDE:
        raise _CannotEvaluateError("not a finite moderate real")
    return value


def variables(text: str) -> set[str]:
    """Single-letter variables in `text` (letters outside LaTeX commands; `i` is the imaginary unit)."""
    letters = re.findall(r"(?<![\\a-zA-Z])[a-zA-Z](?![a-zA-Z])", re.sub(r"\\[a-zA-Z]+", " ", text))
    return set(letters) - {"i"}


def evaluate(text: str, values: Mapping[str, float] | None = None) -> complex | None:
    """The value of `text` with `values` bound to its variables, or None when outside the supported grammar."""
    if len(text) > 300:
        return None
    try:
        tokens = _tokens(text)
        evaluator = _Evaluator(tokens, values or {})
        value = evaluator.expr()
        if evaluator.pos != len(tokens):
            return None
        return _finite(value)
    except (_CannotEvaluateError, ValueError, ZeroDivisionError, OverflowError, RecursionError, TypeError):
        return None


def close(a: complex, b: complex) -> bool:
    """Equal up to double-precision noise (1e-9 relative); differences larger than that are real."""
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def screen(pred: str, gold: str) -> bool | None:
    """True/False when evaluation at numbers (or random points) decides, None when SymPy must."""
    names = variables(pred) | variables(gold)
    if len(names) > 3:
        return None
    samples = (
        [dict.fromkeys(names, 0.0)]
        if not names
        else [{name: point + 0.37 * k for k, name in enumerate(sorted(names))} for point in POINTS]
    )
    agree = True
    for values in samples:
        a, b = evaluate(pred, values), evaluate(gold, values)
        if a is None or b is None:
            return None
        agree = agree and close(a, b)
        if not agree:
            return False
    return True
