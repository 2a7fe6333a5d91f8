"""Honest answers of every common kind come back to the tests as values and score as they should.

The tests run apart from the solution and receive its results as data (`rlloom.rewards.code.wire`); these cases
pin down that the data form keeps what Python's own comparison would see: Fraction, Decimal, Counter, Enum members,
dataclasses, named tuples, iterators, in-place changes to arguments, exceptions the tests expect.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from rlloom.rewards.code import check_asserts, check_calls, check_function
from rlloom.rewards.code.wire import EnumValue, ProtocolError, Record, decode, dumps, encode, loads

CODE_DIR = Path(__file__).resolve().parents[1] / "src" / "rlloom" / "rewards" / "code"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="strong isolation needs root (CI runs as root)")

HONEST = {
    "Fraction": (
        "from fractions import Fraction\ndef f(a, b):\n    return Fraction(a, b)\n",
        ["from fractions import Fraction", "assert f(2, 4) == Fraction(1, 2)", "assert f(3, 1) == 3"],
    ),
    "Decimal": (
        "from decimal import Decimal\ndef f(a, b):\n    return Decimal(a) / Decimal(b)\n",
        ["from decimal import Decimal", "assert f(1, 4) == Decimal('0.25')"],
    ),
    "Counter": (
        "from collections import Counter\ndef f(s, t):\n    return Counter(s)\n",
        [
            "from collections import Counter",
            "assert f('aab', 0) == Counter({'a': 2, 'b': 1})",
            "assert f('aab', 0) == {'a': 2, 'b': 1}",
            "assert f('aab', 0).most_common(1) == [('a', 2)]",
        ],
    ),
    "Enum member compared with the solution's enum": (
        "import enum\nclass Color(enum.Enum):\n    RED = 1\n    BLUE = 2\ndef f(a, b):\n    return Color.BLUE\n",
        ["assert f(0, 0) == Color.BLUE", "assert f(0, 0) != Color.RED", "assert f(0, 0).name == 'BLUE'"],
    ),
    "IntEnum member compared with an int": (
        "import enum\nclass Level(enum.IntEnum):\n    LOW = 1\n    HIGH = 2\ndef f(a, b):\n    return Level.HIGH\n",
        ["assert f(0, 0) == 2"],
    ),
    "dataclass compared with the solution's class": (
        "from dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\n    y: int\n"
        "def f(a, b):\n    return P(a, b)\n",
        ["assert f(1, 2) == P(1, 2)", "assert f(1, 2) != P(2, 1)", "assert f(1, 2).y == 2"],
    ),
    "named tuple, tuple and set": (
        "from collections import namedtuple\nPt = namedtuple('Pt', 'x y')\ndef f(a, b):\n    return Pt(a, b)\n",
        ["assert f(1, 2) == (1, 2)", "assert set(f(1, 2)) == {1, 2}"],
    ),
    "generator and map results": (
        "def f(a, b):\n    return (i * i for i in range(a)) if b else map(str, range(a))\n",
        ["assert list(f(3, 1)) == [0, 1, 4]", "assert list(f(2, 0)) == ['0', '1']"],
    ),
    "dict views": (
        "def f(a, b):\n    return {a: 1, b: 2}.keys()\n",
        ["assert f(1, 2) == {1, 2}", "assert sorted(f(3, 1)) == [1, 3]"],
    ),
    "floats, nan, complex and bytes": (
        "def f(a, b):\n    return [a / b, float('nan'), complex(a, b), bytes([a, b]), float('inf')]\n",
        [
            "import math",
            "r = f(1, 4)",
            "assert r[0] == 0.25 and math.isnan(r[1]) and r[2] == 1 + 4j",
            "assert r[3] == bytes([1, 4]) and r[4] == math.inf",
        ],
    ),
    "in-place change to a list argument": (
        "def f(a, b):\n    a.sort()\n    a.append(b)\n",
        ["xs = [3, 1]", "f(xs, 9)", "assert xs == [1, 3, 9]"],
    ),
    "exceptions the tests expect": (
        "def f(a, b):\n    if b == 0:\n        raise ZeroDivisionError('no')\n    return a // b\n",
        [
            "try:\n    f(1, 0)\n    ok = False\nexcept ZeroDivisionError:\n    ok = True",
            "assert ok",
            "assert f(7, 2) == 3",
        ],
    ),
    "an object the tests build and pass back": (
        "class Node:\n    def __init__(self, v):\n        self.v = v\n        self.next = None\n"
        "def f(node, b):\n    total = 0\n    while node:\n        total += node.v\n        node = node.next\n"
        "    return total\n",
        ["head = Node(1)", "head.next = Node(2)", "head.next.next = Node(3)", "assert f(head, 0) == 6"],
    ),
    "a list of the solution's objects built by the tests (MBPP 601)": (
        "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
        "def f(pairs, n):\n    return sum(p.b - p.a for p in pairs[:n])\n",
        ["assert f([Pair(1, 5), Pair(2, 3)], 2) == 5"],
    ),
    "entry point named like a builtin (MBPP 126)": (
        "def sum(a, b):\n    return a + b\n",
        ["assert sum(10, 15) == 25", "assert sum(1, 2) == 3"],
    ),
}


@needs_root
@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_answers_of_every_kind_pass(name: str) -> None:
    code, lines = HONEST[name]
    setup = "\n".join(line for line in lines if not line.startswith("assert"))
    asserts = [line for line in lines if line.startswith("assert")]
    result = check_asserts(code, asserts, setup=setup)
    assert (result.status, result.score) == ("passed", 1.0), result


@needs_root
def test_leetcode_solution_class_and_function_style() -> None:
    code = (
        "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
        "        for i, n in enumerate(nums):\n            if target - n in seen:\n"
        "                return [seen[target - n], i]\n            seen[n] = i\n"
    )
    assert check_calls(code, "twoSum", [([[2, 7, 11, 15], 9], [0, 1]), ([[3, 2, 4], 6], [1, 2])]).score == 1.0
    check = "def check(candidate):\n    assert candidate([1, 2, 3]) == Fraction(2)\n"
    fraction_mean = "from fractions import Fraction\ndef mean(xs):\n    return Fraction(sum(xs), len(xs))\n"
    assert check_function(fraction_mean, "from fractions import Fraction\n" + check, "mean").score == 1.0


def test_wire_round_trips_plain_values() -> None:
    from collections import Counter, OrderedDict, deque
    from decimal import Decimal
    from fractions import Fraction

    values = [None, True, 3, -2**100, 1.5, "é\n\"", [1, [2]], (1, (2,)), {1: "a", (2, 3): [4]}, {1, 2},
              frozenset({3}), b"\x00\xff", 1 + 2j, Fraction(1, 3), Decimal("1.10"), Counter("aab"),
              OrderedDict(a=1), deque([1, 2])]  # fmt: skip
    for value in values:
        back = decode(loads(dumps(encode(value))))
        assert back == value and type(back) is type(value), value


def test_wire_refuses_what_is_not_its_protocol() -> None:
    for bad in ('{"d": [[[1], 2]]}', '{"x": 1}', '{"t": 1}', '{"fr": [1, 0]}', '{"a": 1, "b": 2}', "NaN"):
        with pytest.raises((ProtocolError, ValueError)):
            decode(loads(bad))
    assert decode(loads('{"dc": ["m.P", [["x", 1]]]}')) == Record("m.P", [("x", 1)])
    assert decode(loads('{"enum": ["m.C", "A", 1]}')) == EnumValue("m.C", "A", 1) != EnumValue("m.C", "B", 1)


def _imports(path: Path) -> set[str]:
    """rlloom.rewards.code modules a file imports (absolute or relative), at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:  # from . import wire / from .wire import x
            found |= {node.module} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlloom.rewards.code."):
            found.add(node.module.rsplit(".", 1)[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.rsplit(".", 1)[1] for a in node.names if a.name.startswith("rlloom.rewards.code.")}
    return found


def test_no_import_cycle_in_the_code_package() -> None:
    """Issue 26: runner <-> containment was a cycle (through a local import); none may remain."""
    graph = {p.stem: _imports(p) for p in CODE_DIR.glob("*.py") if p.stem != "__init__"}
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in graph.get(node, ()):
            assert state.get(nxt) != "open", f"import cycle: {' -> '.join([*path, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for start in graph:
        if start not in state:
            visit(start, [start])
