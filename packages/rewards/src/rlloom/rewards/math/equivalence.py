"""Decide whether a predicted answer equals a gold answer: strings and exact numbers first, SymPy last.

The fast path (normalised string equality, exact rational arithmetic, shapes, choice letters, plain words)
decides most pairs in microseconds. Only scalars it cannot decide go to SymPy, in a killable worker process
(`worker.py`) after `guard.py` has refused inputs that would explode. Every verdict carries the rule that
decided it, so a surprising reward can be explained.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from fractions import Fraction

from rlloom.rewards.math.approximate import evaluate, screen
from rlloom.rewards.math.guard import symbolic_refusal
from rlloom.rewards.math.normalize import (
    Normalized,
    choice_letter,
    normalize,
    reduce_chain,
    stated_choice,
    strip_assignment,
)
from rlloom.rewards.math.numeric import (
    MIN_SIGNIFICANT,
    approximates,
    check_precision,
    irrational_digits,
    numbers_match,
    parse_number,
)
from rlloom.rewards.math.structure import Shape, parse_shape, split_top_level
from rlloom.rewards.math.worker import bounded_symbolic_equal

DEFAULT_TIMEOUT = 3.0
MAX_ANSWER_CHARS = 2_000
# Words that are LaTeX commands or function names, not prose: an answer made of these is math, not text.
_MATH_WORDS_TEXT = """
    sin cos tan cot sec csc log ln exp sqrt frac pi infty cdot times arcsin
    arccos arctan sinh cosh tanh lim sum int det max min gcd lcm mod pmod bmod
    binom choose leq geq neq cup cap emptyset varnothing circ dots ldots cdots theta alpha beta
    gamma delta phi omega lambda sigma mu rho tau epsilon varepsilon mathbf begin end pmatrix bmatrix
    matrix vmatrix array overline hat vec angle triangle perp parallel approx pm mp infinity i
"""
_MATH_WORDS = frozenset(_MATH_WORDS_TEXT.split())
_WORD_RE = re.compile(r"[A-Za-z]{3,}")
# SymPy verdicts by (pred, gold, precision) after normalisation: a GRPO group repeats the same answers many times.
SYMBOLIC_CACHE_SIZE = 65_536
_SYMBOLIC_CACHE: dict[tuple[str, str, int], Verdict] = {}


@dataclass(frozen=True)
class Verdict:
    """Whether two answers are equivalent, and which rule decided it."""

    equal: bool
    reason: str


class _Budget:
    """Wall-clock budget shared by all SymPy calls of one comparison, so a 10-part tuple cannot take 10x; it
    also carries the comparison's `precision` (significant digits a decimal must show, see `numeric`)."""

    def __init__(self, seconds: float, precision: int = MIN_SIGNIFICANT) -> None:
        self._deadline = time.monotonic() + seconds
        self.precision = precision

    def left(self) -> float:
        return max(0.0, self._deadline - time.monotonic())


def _is_text(s: str) -> bool:
    """Plain words ("odd", "Devon", "no solution"): compared as text, never parsed as a product of symbols."""
    words = _WORD_RE.findall(s.replace("\\", " \\"))
    return any(w.lower() not in _MATH_WORDS for w in words) and not re.search(r"\\(?:frac|sqrt|begin)", s)


def _text_key(s: str) -> str:
    return re.sub(r"[\s{}\\,.]|\b(?:the|a|an)\b", "", s.lower())


def _scalar_equal(pred: str, gold: str, budget: _Budget) -> Verdict:
    if pred == gold:
        return Verdict(True, "identical after normalisation")
    if not pred or not gold:
        return Verdict(False, "empty answer")
    base_verdict = _base_numerals_equal(pred, gold)
    if base_verdict is not None:
        return base_verdict
    pn, gn = parse_number(pred), parse_number(gold)
    if pn is not None and gn is not None:
        return Verdict(numbers_match(pn, gn, min_significant=budget.precision), "exact numbers")
    if re.fullmatch(r"[-+]?\\infty|[-+]?\\infinity|\\infty", pred) or re.fullmatch(r"[-+]?\\infty", gold):
        return Verdict(pred.lstrip("+") == gold.lstrip("+"), "infinity")
    if _is_text(gold) or _is_text(pred):
        return Verdict(_text_key(pred) == _text_key(gold), "text")
    decimal = next((n for n in (pn, gn) if n is not None and n.decimals is not None), None)
    if decimal is not None and decimal.decimals is not None and decimal.decimals <= 10:
        other = evaluate(gold if decimal is pn else pred)
        if other is not None and other.imag == 0:  # against pi, a radical: four significant digits, to its precision
            digits = irrational_digits(budget.precision)
            return Verdict(approximates(decimal, Fraction(other.real), min_significant=digits), "decimal approximation")
    screened = screen(pred, gold)
    if screened is not None:
        return Verdict(screened, "numeric screen")
    refusal = symbolic_refusal(pred) or symbolic_refusal(gold)
    if refusal:
        return Verdict(False, f"not checked symbolically: {refusal}")
    seconds = budget.left()
    if seconds <= 0:
        return Verdict(False, "timeout: comparison budget spent")
    cached = _SYMBOLIC_CACHE.get((pred, gold, budget.precision))
    if cached is not None:
        return cached
    equal, reason = bounded_symbolic_equal(pred, gold, seconds, budget.precision)
    verdict = Verdict(equal, reason)
    if not reason.startswith(("timeout", "symbolic worker")):  # only settled verdicts are worth remembering
        if len(_SYMBOLIC_CACHE) >= SYMBOLIC_CACHE_SIZE:
            _SYMBOLIC_CACHE.pop(next(iter(_SYMBOLIC_CACHE)))
        _SYMBOLIC_CACHE[(pred, gold, budget.precision)] = verdict
    return verdict


_BASE_NUMERAL_RE = re.compile(r"^(\w+)_\{?(\d+)\}?$")


def _base_numerals_equal(pred: str, gold: str) -> Verdict | None:
    """`2516_8`: digits and base must match; a prediction that drops the subscript keeps its digits."""
    pm, gm = _BASE_NUMERAL_RE.match(pred), _BASE_NUMERAL_RE.match(gold)
    if gm is None and pm is None:
        return None
    p_digits, p_base = (pm.group(1), pm.group(2)) if pm else (pred, None)
    g_digits, g_base = (gm.group(1), gm.group(2)) if gm else (gold, None)
    if not (p_digits.isalnum() and g_digits.isalnum()):
        return None
    same_base = p_base is None or g_base is None or int(p_base) == int(g_base)
    return Verdict(same_base and p_digits.upper() == g_digits.upper(), "base-n numeral")


def clear_symbolic_cache() -> None:
    """Forget remembered SymPy verdicts (benchmarks call this so each timed run starts cold)."""
    _SYMBOLIC_CACHE.clear()


def _match_unordered(preds: tuple[str, ...], golds: tuple[str, ...], budget: _Budget) -> bool:
    """A perfect matching between two lists as sets (exact repeats dropped; backtracking, lists are short)."""
    preds, golds = tuple(dict.fromkeys(preds)), tuple(dict.fromkeys(golds))
    if len(preds) != len(golds):
        return False
    used = [False] * len(golds)

    def assign(i: int) -> bool:
        if i == len(preds):
            return True
        for j, gold in enumerate(golds):
            if not used[j] and _scalar_or_shape_equal(preds[i], gold, budget).equal:
                used[j] = True
                if assign(i + 1):
                    return True
                used[j] = False
        return False

    return assign(0)


def _match_ordered(preds: tuple[str, ...], golds: tuple[str, ...], budget: _Budget) -> bool:
    return len(preds) == len(golds) and all(
        _scalar_or_shape_equal(p, g, budget).equal for p, g in zip(preds, golds, strict=True)
    )


def _flatten_vector(shape: Shape) -> tuple[str, ...] | None:
    if shape.kind == "matrix" and shape.rows and all(len(r) == 1 for r in shape.rows):
        return tuple(r[0] for r in shape.rows)
    if shape.kind == "matrix" and len(shape.rows) == 1:
        return shape.rows[0]
    if shape.kind == "tuple" and shape.brackets in ("()", "[]"):
        return shape.parts
    return None


def _shapes_equal(ps: Shape, gs: Shape, budget: _Budget) -> Verdict:
    if gs.kind == "matrix" or ps.kind == "matrix":
        if gs.kind == ps.kind == "matrix":
            same_shape = len(ps.rows) == len(gs.rows) and all(
                len(a) == len(b) for a, b in zip(ps.rows, gs.rows, strict=True)
            )
            flat_p = tuple(c for r in ps.rows for c in r)
            flat_g = tuple(c for r in gs.rows for c in r)
            return Verdict(same_shape and _match_ordered(flat_p, flat_g, budget), "matrix")
        pv, gv = _flatten_vector(ps), _flatten_vector(gs)
        ok = pv is not None and gv is not None and _match_ordered(pv, gv, budget)
        return Verdict(ok, "vector")
    if gs.kind == "tuple" and ps.kind == "tuple":
        return Verdict(ps.brackets == gs.brackets and _match_ordered(ps.parts, gs.parts, budget), "ordered tuple")
    if gs.kind == "tuple" and ps.kind == "list" and gs.brackets == "()":
        return Verdict(_match_ordered(ps.parts, gs.parts, budget), "tuple written without brackets")
    if gs.kind in ("list", "set") and ps.kind in ("list", "set"):
        return Verdict(_match_unordered(ps.parts, gs.parts, budget), "unordered collection")
    if gs.kind == "scalar" and ps.kind == "list":
        # "\\boxed{15\\frac{39}{40}} or \\boxed{\\frac{639}{40}}" states one answer twice; a hedge lists different ones.
        same = all(_scalar_or_shape_equal(p, gs.parts[0], budget).equal for p in ps.parts)
        return Verdict(same, "every listed form equals the gold" if same else "a list where one answer is due")
    if gs.kind == "union" and ps.kind == "union":
        return Verdict(_match_unordered(ps.parts, gs.parts, budget), "union of intervals")
    return Verdict(False, f"shape differs: {ps.kind} vs {gs.kind}")


def _scalar_or_shape_equal(pred: str, gold: str, budget: _Budget) -> Verdict:
    ps, gs = parse_shape(pred), parse_shape(gold)
    if ps.kind == gs.kind == "scalar":
        return _scalar_equal(pred, gold, budget)
    if gs.kind == "set" and ps.kind == "scalar" and len(gs.parts) == 1:
        return _scalar_equal(pred, gs.parts[0], budget)
    return _shapes_equal(ps, gs, budget)


def _percent_candidates(norm: Normalized) -> list[str]:
    """A percent answer p% may be meant as p or as p/100; a plain answer only as itself."""
    if not norm.percent:
        return [norm.text]
    number = parse_number(norm.text)
    if number is None:
        return [norm.text]
    return [norm.text, _fraction_text(number.value / 100)]


def _fraction_text(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _strip_assignments(text: str) -> str:
    """`x=3` -> `3`, and item by item in a list: `x=2, x=-2` -> `2, -2` (MATH's "all solutions" as equations)."""
    parts = split_top_level(text, ",")
    if len(parts) == 1:
        return strip_assignment(text)
    return ", ".join(strip_assignment(part) for part in parts)


_DECIMAL_COMMA_RE = re.compile(r"-?\d+,\d+")
_DECIMAL_RE = re.compile(r"-?\d*\.\d+")


def _decimal_comma(text: str, other: str) -> str:
    """`1000,99` against a decimal `1000.99` is a decimal comma; against anything else it stays a two-item list."""
    if _DECIMAL_COMMA_RE.fullmatch(text) and _DECIMAL_RE.fullmatch(other):
        return text.replace(",", ".")
    return text


def compare(pred: str, gold: str, *, timeout: float = DEFAULT_TIMEOUT, precision: int = MIN_SIGNIFICANT) -> Verdict:
    """Full verdict for one (pred, gold) pair: see `is_equivalent`."""
    check_precision(precision)
    if not isinstance(pred, str) or not isinstance(gold, str):
        return Verdict(False, "answer is not a string")
    if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        return Verdict(False, f"answer longer than {MAX_ANSWER_CHARS} characters")
    pn, gn = normalize(pred), normalize(gold)
    if not pn.text or not gn.text:
        return Verdict(False, "empty answer after normalisation")
    if pn.unit and gn.unit and pn.unit != gn.unit:  # `5 cm` is not `5 m`, and `500 cm` is not written as `5 m`
        return Verdict(False, f"different units: {pn.unit} vs {gn.unit}")
    gold_letter = choice_letter(gold)
    if gold_letter is not None:
        return Verdict(stated_choice(pred) == gold_letter, "multiple-choice letter")
    pn = Normalized(_decimal_comma(reduce_chain(pn.text), gn.text), pn.percent)
    gn = Normalized(_decimal_comma(reduce_chain(gn.text), pn.text), gn.percent)
    if ("=" in pn.text) != ("=" in gn.text):
        pn = Normalized(_strip_assignments(pn.text), pn.percent)
        gn = Normalized(_strip_assignments(gn.text), gn.percent)
    if ("=" in pn.text) != ("=" in gn.text):
        return Verdict(False, "an equation against a value")
    budget = _Budget(timeout, precision)
    if pn.percent == gn.percent:
        return _scalar_or_shape_equal(pn.text, gn.text, budget)
    # Exactly one side has a percent sign: "10%" equals "10" and "0.1", but never both ways for the same side.
    last = Verdict(False, "percent")
    for p in _percent_candidates(pn):
        for g in _percent_candidates(gn):
            last = _scalar_or_shape_equal(p, g, budget)
            if last.equal:
                return Verdict(True, f"percent: {last.reason}")
    return last


def is_equivalent(
    pred: str, gold: str | list[str], *, timeout: float = DEFAULT_TIMEOUT, precision: int = MIN_SIGNIFICANT
) -> bool:
    """Whether `pred` is mathematically the same answer as `gold` (or any of its accepted forms).

    `timeout` bounds the SymPy stage per gold form (seconds, enforced by killing a worker process); the string
    and exact-number fast path runs first and usually decides without SymPy. `precision`: the significant digits
    a rounded decimal must show to match an exact gold (default 3; see `numeric`).
    """
    golds = [gold] if isinstance(gold, str) else list(gold)
    return any(compare(pred, g, timeout=timeout, precision=precision).equal for g in golds)
