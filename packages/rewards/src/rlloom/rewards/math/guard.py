"""Refuse inputs that make SymPy explode before SymPy ever sees them.

A timeout alone is not enough: big-integer work in C (`9^{9^{9^9}}`, `100000!`) ignores signals and can eat
all memory before any timer fires. These checks are cheap string scans; an answer that fails one is judged
without SymPy (string and exact-number rules only).
"""

from __future__ import annotations

import re

MAX_SYMBOLIC_CHARS = 300
MAX_NESTING = 24
_POWER_RE = re.compile(r"\^\s*(\{|\(|-?\d+(?:\.\d+)?)")
_FACTORIAL_RE = re.compile(r"(\d+)\s*!|\}\s*!|\)\s*!")
_NUMBER_RE = re.compile(r"\d+")


def _group(text: str, start: int) -> str:
    """The bracket group opening at `start` (to the end of text if unbalanced)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "{(":
            depth += 1
        elif text[i] in "})":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return text[start + 1 :]


def _nesting_depth(text: str) -> int:
    depth = best = 0
    for ch in text:
        if ch in "({[":
            depth += 1
            best = max(best, depth)
        elif ch in ")}]":
            depth -= 1
    return best


def symbolic_refusal(text: str) -> str | None:
    """Why `text` must not reach SymPy, or None when it is safe to try."""
    if len(text) > MAX_SYMBOLIC_CHARS:
        return f"answer longer than {MAX_SYMBOLIC_CHARS} characters"
    if _nesting_depth(text) > MAX_NESTING:
        return f"brackets nested deeper than {MAX_NESTING}"
    if text.count("^") > 6:
        return "more than 6 powers"
    for m in _POWER_RE.finditer(text):
        # A power tower or a power with a large exponent: sympy would expand it to a huge integer.
        exponent = m.group(1)
        if exponent in "{(":
            exponent = _group(text, m.end() - 1)
            if "^" in exponent:
                return "nested powers"
        numbers = [int(n) for n in _NUMBER_RE.findall(exponent)[:4] if len(n) < 12]
        if any(len(n) >= 12 for n in _NUMBER_RE.findall(exponent)) or (numbers and max(numbers) > 10_000):
            return "exponent above 10000"
    for m in _FACTORIAL_RE.finditer(text):
        if m.group(1) is None or int(m.group(1)) > 1000:
            return "factorial of a large or non-literal number"
    if any(len(n) > 200 for n in _NUMBER_RE.findall(text)):
        return "a number with more than 200 digits"
    return None
