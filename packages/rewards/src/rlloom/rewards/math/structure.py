"""Split a normalised answer into its shape: scalar, ordered tuple, unordered list/set, interval union, matrix.

Shape decides how parts are compared: `(1,2)` and `[1,2]` differ (open vs closed interval), `\\{1,2\\}` and
`\\{2,1\\}` are the same set, and a bare comma list `3, -2` is the MATH convention for "all solutions", so it is
unordered. Matrices keep their shape; an n x 1 matrix equals an n-tuple (a column vector written either way).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["scalar", "tuple", "list", "set", "union", "matrix"]
_MATRIX_RE = re.compile(r"^\\begin\{([pbvBV]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}$", re.DOTALL)
_OPEN = "([{"
_CLOSE = ")]}"


@dataclass(frozen=True)
class Shape:
    """A parsed answer: its kind, the bracket pair for tuples/intervals, and its parts (nested for matrices)."""

    kind: Kind
    parts: tuple[str, ...] = ()
    brackets: str = ""
    rows: tuple[tuple[str, ...], ...] = ()


def split_top_level(text: str, separator: str) -> list[str]:
    """Split on `separator` only outside (), [], {} and `\\{ \\}` (an escaped brace is still a bracket here)."""
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(separator)
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            depth += 1 if text[i + 1] == "{" else -1
            i += 2
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i + n
            i += n
            continue
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _enclosed(text: str, left: str, right: str) -> bool:
    """Whether `left` at the start is matched by `right` at the very end (not "(1)+(2)")."""
    if not (text.startswith(left) and text.endswith(right)) or len(text) < len(left) + len(right):
        return False
    depth = 0
    i = 0
    while i < len(text):
        if text.startswith("\\{", i) or text.startswith("\\}", i):
            depth += 1 if text[i + 1] == "{" else -1
            i += 2
        else:
            ch = text[i]
            depth += 1 if ch in _OPEN else -1 if ch in _CLOSE else 0
            i += 1
        if depth == 0 and i < len(text):
            return False
    return depth == 0


_LESS = r"(<|\\leqslant|\\leq|\\le)"
_GREATER = r"(>|\\geqslant|\\geq|\\ge)"
_VAR = r"-?[a-zA-Z](?:\([a-zA-Z]\))?"  # x, -x, f(x)
_ONE_SIDED_RE = re.compile(rf"^({_VAR})\s*(?:{_LESS}|{_GREATER})\s*(.+)$")
_BOUND_FIRST_RE = re.compile(rf"^(.+?)\s*(?:{_LESS}|{_GREATER})\s*({_VAR})$")
_TWO_SIDED_RE = re.compile(rf"^(.+?)\s*{_LESS}\s*({_VAR})\s*{_LESS}\s*(.+)$")
_FLIP = {"<": ">", ">": "<", "\\leq": "\\geq", "\\geq": "\\leq", "\\le": "\\ge", "\\ge": "\\le"}
_FLIP |= {"\\leqslant": "\\geq", "\\geqslant": "\\leq"}


def _one_sided(text: str) -> tuple[str, str] | None:
    """(op, bound) with the variable on the left and positive: `5 \\leq x` and `-x \\geq -5` -> (`\\geq`, ...)."""
    one = _ONE_SIDED_RE.match(text)
    if one:
        var, less, greater, bound = one.groups()
        op = less or greater
    else:
        first = _BOUND_FIRST_RE.match(text)
        if first is None or _ONE_SIDED_RE.match(first.group(1)):
            return None
        bound, less, greater, var = first.groups()
        op = _FLIP[less or greater]
    if var.startswith("-"):
        op, bound = _FLIP[op], f"-({bound})"
    return op, bound


def inequality_as_interval(text: str) -> str | None:
    """`x>3` -> `(3,\\infty)`, `-1\\leq x<2` -> `[-1,2)`: a one-variable inequality is the interval it describes."""
    two = _TWO_SIDED_RE.match(text)
    if two:
        low, low_op, var, high_op, high = two.groups()
        if var.startswith("-"):
            return None
        return ("(" if low_op == "<" else "[") + f"{low},{high}" + (")" if high_op == "<" else "]")
    one = _one_sided(text)
    if one:
        op, bound = one
        if op in ("<", "\\leq", "\\le"):
            return f"(-\\infty,{bound}" + (")" if op == "<" else "]")
        return ("(" if op == ">" else "[") + f"{bound},\\infty)"
    return None


def parse_shape(text: str) -> Shape:
    """The shape of a normalised answer (see module docstring)."""
    interval = inequality_as_interval(text)
    if interval is not None:
        text = interval
    matrix = _MATRIX_RE.match(text.strip())
    if matrix:
        body = matrix.group(2).strip().replace("\\\\\\\\", "\\\\")
        rows = tuple(tuple(cell.strip() for cell in row.split("&")) for row in re.split(r"\\\\", body) if row.strip())
        return Shape(kind="matrix", rows=rows)
    union = split_top_level(text, "\\cup")
    if len(union) > 1:
        return Shape(kind="union", parts=tuple(union))
    if _enclosed(text, "\\{", "\\}"):
        return Shape(kind="set", parts=tuple(split_top_level(text[2:-2], ",")))
    if len(text) >= 2 and text[0] in "([" and text[-1] in ")]":
        # An interval's brackets need not match each other ("[1,2)"), so check the body is balanced instead.
        inner = split_top_level(text[1:-1], ",")
        if len(inner) > 1 and _balanced(text[1:-1]):
            return Shape(kind="tuple", parts=tuple(inner), brackets=text[0] + text[-1])
    parts = split_top_level(text, ",")
    if len(parts) > 1 and all(parts):
        return Shape(kind="list", parts=tuple(parts))
    if text.count("\\pm") == 1 and not text.endswith("\\pm"):
        # "3 \\pm 2\\sqrt{2}" names two answers: both must be given.
        return Shape(kind="list", parts=(text.replace("\\pm", "+"), text.replace("\\pm", "-")))
    return Shape(kind="scalar", parts=(text,))


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += 1 if ch in _OPEN else -1 if ch in _CLOSE else 0
        if depth < 0:
            return False
    return depth == 0
