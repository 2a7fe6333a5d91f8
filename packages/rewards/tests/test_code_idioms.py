"""Honest answers that plain Python passes pass the sandboxed tests too (issue 39), and the two idioms that would
reopen forgery stay refused, each with a reason.

The tests run apart from the solution and see its results as data (`rlloom.rewards.code.wire`), its objects as
handles, and lend it their callables as handles it can call (`rlloom.rewards.code.channel`). Each idiom below
was refused before this round; each must now score 1.0 exactly as `exec(solution); exec(tests)` would.
"""

from __future__ import annotations

import importlib.util
import os
from collections import defaultdict

import pytest

from rlloom.rewards.code import Limits, check_asserts, check_function, execute
from rlloom.rewards.code.wire import decode, dumps, encode, loads

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(os.geteuid() != 0, reason="strong isolation needs root (CI runs as root)"),
]
HAS_NUMPY = importlib.util.find_spec("numpy") is not None

IDIOMS: dict[str, tuple[str, list[str]]] = {
    "returns a range": (
        "def f(n):\n    return range(n)\n",
        ["assert f(3) == range(3)", "assert list(f(3)) == [0, 1, 2]", "assert f(5)[1:3] == range(1, 3)"],
    ),
    "returns dict_keys (order kept)": (
        "def f(d):\n    return d.keys()\n",
        ["assert f({2: 1, 1: 2}) == {1, 2}", "assert list(f({2: 1, 1: 2})) == [2, 1]"],
    ),
    "returns dict_items and dict_values": (
        "def f(d):\n    return d.items(), d.values()\n",
        ["assert f({1: 2})[0] == {(1, 2)}", "assert list(f({1: 2, 3: 4})[1]) == [2, 4]"],
    ),
    "the test passes a lambda": (
        "def f(xs, g):\n    return [g(x) for x in xs]\n",
        ["assert f([1, 2], lambda x: x * 10) == [10, 20]"],
    ),
    "the test passes a key function by keyword": (
        "def f(xs, key=None):\n    return sorted(xs, key=key)\n",
        ["def last(s):\n    return s[-1]\nassert f(['ab', 'ba', 'cc'], key=last) == ['ba', 'ab', 'cc']"],
    ),
    "the test passes builtins": (
        "def f(xs, g):\n    return list(map(g, xs))\n",
        [
            "assert f(['ab', 'c'], len) == [2, 1]",
            "assert f(['A'], str.lower) == ['a']",
            "import math\nassert f([4.0], math.sqrt) == [2.0]",
            "assert f(['1'], int) == [1]",
        ],
    ),
    "an int over 4,300 digits, returned and passed": (
        "def f(n):\n    return 7 ** n\ndef g(n):\n    return n + 1\n",
        ["assert f(20000) == 7 ** 20000", "assert g(-(7 ** 20000)) == 1 - 7 ** 20000"],
    ),
    "a result over 16 MB": (
        "def f(n):\n    return ['x' * 100] * n\n",
        ["assert len(f(250_000)) == 250_000"],
    ),
    "an iterator over 1M items": (
        "def f(n):\n    return (i for i in range(n))\n",
        ["assert sum(f(1_200_000)) == 719999400000"],
    ),
    "an endless generator, read lazily": (
        "def f():\n    i = 0\n    while True:\n        yield i\n        i += 1\n",
        ["g = f()\nassert next(g) == 0 and next(g) == 1"],
    ),
    "in-place change through a keyword argument": (
        "def f(x, *, out):\n    out.append(x)\n",
        ["xs = []\nf(1, out=xs)\nassert xs == [1]"],
    ),
    "in-place change inside a tuple (nested lists keep their identity)": (
        "def f(pair):\n    pair[0].append(1)\n    pair[1]['k'] = 2\ndef g(grid):\n    grid[0][0] = 9\n",
        [
            "a, b = [], {}\nf((a, b))\nassert a == [1] and b == {'k': 2}",
            "m = [[1, 2], [3]]\nrow = m[0]\ng(m)\nassert row == [9, 2]",
        ],
    ),
    "the solution's own exception classes": (
        "class BadInput(ValueError):\n    pass\nclass WorseInput(BadInput):\n    pass\n"
        "def f(x):\n    if x < 0:\n        raise WorseInput('negative')\n    return x\n",
        [
            "try:\n    f(-1)\n    caught = False\nexcept BadInput:\n    caught = True\nassert caught",
            "try:\n    f(-1)\nexcept ValueError as e:\n    assert str(e) == 'negative'",
            "assert issubclass(WorseInput, BadInput)",
        ],
    ),
    "a defaultdict's default": (
        "from collections import defaultdict\ndef f(words):\n    d = defaultdict(list)\n"
        "    for w in words:\n        d[w[0]].append(w)\n    return d\n",
        ["assert f(['ab', 'ac'])['z'] == []", "assert f(['ab', 'ac']) == {'a': ['ab', 'ac']}"],
    ),
    "an iterable object": (
        "class Fib:\n    def __init__(self, n):\n        self.n = n\n    def __iter__(self):\n"
        "        a, b = 0, 1\n        for _ in range(self.n):\n            yield a\n            a, b = b, a + b\n"
        "def f(n):\n    return Fib(n)\n",
        [
            "assert list(f(6)) == [0, 1, 1, 2, 3, 5]",
            "assert 5 in f(6) and 4 not in f(6)",
            "assert sorted(f(4)) == [0, 1, 1, 2]",
        ],
    ),
    "the test passes a generator": (
        "def f(items):\n    return sum(items)\n",
        ["assert f(x * x for x in range(5)) == 30", "assert f(iter(range(100_000))) == 4999950000"],
    ),
}
NUMPY_IDIOM = (
    "import numpy as np\ndef f(xs):\n    a = np.array(xs)\n    return a.sum(), a * 2, a.mean()\ndef g(a):\n"
    "    return a.sum()\n",
    [
        "assert f([1, 2, 3])[0] == 6",
        "assert list(f([1, 2])[1]) == [2, 4]",
        "assert f([1, 2])[2] == 1.5",
        "import numpy as np\nassert (f([1, 2])[1] == np.array([2, 4])).all()",
        "import numpy as np\nassert g(np.arange(4)) == 6",
    ],
)


def _check(code: str, lines: list[str]) -> None:
    result = check_asserts(code, lines, limits=Limits(timeout=60))
    assert (result.status, result.score) == ("passed", 1.0), result


@pytest.mark.parametrize("name", sorted(IDIOMS))
def test_honest_idiom_passes(name: str) -> None:
    _check(*IDIOMS[name])


@pytest.mark.skipif(not HAS_NUMPY, reason="numpy is not installed for the scoring interpreter")
def test_numpy_is_importable_read_only() -> None:
    _check(*NUMPY_IDIOM)
    code = "import numpy, os\nmounts = [line.split() for line in open('/proc/self/mountinfo')]\n"
    code += "print([m[5].split(',')[0] for m in mounts if m[4] == os.path.dirname(numpy.__file__)])\n"
    result = execute(code)
    assert (result.status, result.stdout) == ("ok", "['ro']\n"), result


def test_honest_idiom_through_check_function() -> None:
    """HumanEval-style: the test passes a key function and reads a defaultdict default."""
    code = "from collections import defaultdict\ndef group(xs, key):\n    d = defaultdict(list)\n"
    code += "    for x in xs:\n        d[key(x)].append(x)\n    return d\n"
    test = "def check(candidate):\n    d = candidate([1, 2, 3, 4], lambda x: x % 2)\n"
    test += "    assert d == {1: [1, 3], 0: [2, 4]}\n    assert candidate([], len)[7] == []\n"
    assert check_function(code, test, "group").score == 1.0


# --- refused with a reason: what would let a solution decide its own grade -------------------------------------

REFUSED = {
    "an object's own __eq__ deciding a comparison": (
        "class P:\n    def __init__(self, x):\n        self.x = x\n    def __eq__(self, other):\n"
        "        return self.x == other.x\ndef f(x):\n    return P(x)\n",
        "assert f(1) == P(1)",
        "own __eq__ would decide the comparison",
    ),
    "identity across the boundary": (
        "def f(xs):\n    xs.append(1)\n    return xs\n",
        "a = []\nassert f(a) is a",
        "an identity test, `is`, is never true across the sandbox boundary",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_forgery_reopening_idioms_stay_refused_with_a_reason(name: str) -> None:
    code, line, reason = REFUSED[name]
    result = check_asserts(code, [line])
    assert result.score == 0.0 and reason in result.tests[0].reason, result
    assert check_asserts(code, ["assert f([]) == [1]" if "xs" in code else "assert f(1).x == 1"]).score == 1.0


# --- the data form ---------------------------------------------------------------------------------------------


def test_wire_round_trips_the_new_kinds() -> None:
    factory = defaultdict(int, {"a": 1})
    values = [range(2, 9, 3), 7**20000, -(7**20000), bytearray(b"ab"), factory, {1: 2}.keys(), [1, 2.5, "x"]]
    for value in values:
        back = decode(loads(dumps(encode(value))))
        assert back == value and type(back) is type(value), value
    assert decode(loads(dumps(encode(factory))))["missing"] == 0
    assert list(decode(loads(dumps(encode({3: 1, 1: 2}.keys()))))) == [3, 1]  # a view keeps its order
    assert list(decode(loads(dumps(encode({3: 1, 1: 2}.items()))))) == [(3, 1), (1, 2)]
