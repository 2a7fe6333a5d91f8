"""SymPy equivalence of two scalar LaTeX answers, parsed with Math-Verify's LaTeX parser (latex2sympy2_extended).

This runs inside the bounded worker process (see `worker.py`), never in the caller, because SymPy can hang.
Equality is decided by, in order: `simplify(a - b) == 0`; for constants, a 40-digit numerical difference
below 1e-12 relative (exact-enough, and unlike 6-digit rounding it keeps `1/2^99` and `1/2^98` apart); for
expressions with free symbols, agreement at five random points. Equations compare as `lhs - rhs` up to a
non-zero constant factor, so `y = 2x + 1` matches `2x - y + 1 = 0`.
"""

from __future__ import annotations

import cmath
import random
import re
from fractions import Fraction
from typing import Any

import sympy
from latex2sympy2_extended import latex2sympy
from latex2sympy2_extended.latex2sympy2 import ConversionConfig

from rlloom.rewards.math.numeric import MIN_SIGNIFICANT, Number, approximates, irrational_digits

_CONFIG = ConversionConfig(interpret_as_mixed_fractions=True, lowercase_symbols=False)
_DECIMAL_RE = re.compile(r"^-?\d*\.(\d+)$")
_PRECISION = 40


_CONSTANTS = {sympy.Symbol("i"): sympy.I, sympy.Symbol("e"): sympy.E}


def to_sympy(text: str) -> Any:
    """Parse normalised LaTeX to a SymPy object (raises on failure); free `i` and `e` are the constants."""
    expr = latex2sympy(text, conversion_config=_CONFIG)
    if isinstance(expr, sympy.Basic) and expr.free_symbols & set(_CONSTANTS):
        expr = expr.xreplace(_CONSTANTS)
    return expr


def _is_zero(expr: Any, scale: Any) -> bool:
    if expr == 0:
        return True
    if expr.free_symbols:
        return False
    value = sympy.N(expr, _PRECISION)
    size = max(1.0, abs(complex(sympy.N(scale, _PRECISION))))
    try:
        return bool(abs(complex(value)) <= 1e-12 * size)
    except (TypeError, ValueError):
        return False


def _agree_at_random_points(a: Any, b: Any) -> bool:
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    rng = random.Random(20260101)
    for _ in range(5):
        point = {s: sympy.Rational(rng.randint(11, 97), rng.randint(7, 29)) for s in symbols}
        try:
            va = complex(sympy.N(a.subs(point), _PRECISION))
            vb = complex(sympy.N(b.subs(point), _PRECISION))
        except (TypeError, ValueError, ZeroDivisionError):
            return False
        if not (cmath.isfinite(va) and cmath.isfinite(vb)):  # `x/0` is NaN everywhere: NaN equals nothing
            return False
        if abs(va - vb) > 1e-9 * max(1.0, abs(va), abs(vb)):
            return False
    return True


def _expressions_equal(a: Any, b: Any, pred_text: str, precision: int) -> bool:
    if a == b:
        return True
    diff = a - b
    if _is_zero(sympy.simplify(diff), b):
        return True
    if not (a.free_symbols or b.free_symbols):
        decimal = _DECIMAL_RE.match(pred_text)
        if decimal:  # a decimal against a closed form: the precision it shows, 3 significant digits (4 if irrational)
            exact = Fraction(str(sympy.N(b, _PRECISION)))
            digits = precision if b.is_rational else irrational_digits(precision)
            return approximates(Number(Fraction(pred_text), len(decimal.group(1))), exact, min_significant=digits)
        return False
    return _agree_at_random_points(a, b)


def _equations_equal(a: Any, b: Any) -> bool:
    da = a.lhs - a.rhs
    db = b.lhs - b.rhs
    if db == 0:
        return bool(da == 0)
    ratio = sympy.simplify(da / db)
    return bool(ratio != 0 and not ratio.free_symbols)


def _undefined(expr: Any) -> bool:
    return isinstance(expr, sympy.Basic) and bool(expr.has(sympy.zoo, sympy.nan))


def symbolic_equal(pred: str, gold: str, precision: int = MIN_SIGNIFICANT) -> tuple[bool, str]:
    """Whether two normalised scalar answers are equal; the second item says which rule decided. `precision`:
    the significant digits a decimal must show to match an exact value (see `numeric`)."""
    try:
        a = to_sympy(pred)
        b = to_sympy(gold)
    except Exception as exc:
        return False, f"unparseable: {type(exc).__name__}"
    if _undefined(a) or _undefined(b):  # `\\frac{1}{0}`, `12:00` read as 12/0: no value, so equal to nothing
        return False, "sympy: undefined value (division by zero)"
    try:
        a_eq = isinstance(a, sympy.Equality)
        b_eq = isinstance(b, sympy.Equality)
        if a_eq and b_eq:
            return _equations_equal(a, b), "sympy equation"
        if a_eq and isinstance(a.lhs, sympy.Symbol) and not b_eq:
            a = a.rhs
        if b_eq and isinstance(b.lhs, sympy.Symbol) and not a_eq:
            b = b.rhs
        if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
            return _expressions_equal(a, b, pred, precision), "sympy expression"
        return bool(a == b), "sympy structural"
    except Exception as exc:
        return False, f"sympy error: {type(exc).__name__}"
