"""Hostile programs against the code scorers, by class: each earns zero and leaves the host as it was.

Every program here tries to win credit without solving its task (forgery, namespace tricks, interpreter flags)
or to hurt or outlive the host (resources, persistence), or to read the tests (information leaks). Each test
asserts a score of 0 and an unharmed host: no file written outside the sandbox, no process left under a sandbox
uid, no pseudo-terminal taken. An honest solution of the same task is checked to pass, so a zero means the trick
failed rather than the task being broken.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlloom.rewards.batch import score_batch
from rlloom.rewards.code import (
    Limits,
    check_asserts,
    check_calls,
    check_function,
    humaneval_scorer,
    io_scorer,
    mbpp_scorer,
)

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="strong isolation needs root (CI runs as root)"),
]
REPO = Path(__file__).resolve().parents[3]

SQUARE_TESTS = ["assert square(3) == 9", "assert square(-4) == 16", "assert square(12) == 144"]
SQUARE_CHECK = "def check(candidate):\n    assert candidate(3) == 9\n    assert candidate(-4) == 16\n"
SQUARE_CHECK += "    assert candidate(12) == 144\n"
HONEST_SQUARE = "def square(x):\n    return x * x\n"
ALWAYS_EQUAL = """
class Eq:
    def __init__(self, *args):
        pass
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __bool__(self):
        return True
    def __sub__(self, other):
        return 0
    __rsub__ = __add__ = __radd__ = __sub__
    def __abs__(self):
        return 0
    __hash__ = object.__hash__
"""


def _ptys() -> int:
    return int(Path("/proc/sys/kernel/pty/nr").read_text())


@pytest.fixture
def host(sandbox_processes: Callable[..., list[str]]) -> Iterator[dict[str, str]]:
    """Marker paths a program may try to write, and the checks that the host is as it was afterwards."""
    tag = uuid.uuid4().hex[:12]
    marks = {"tmp_mark": f"/tmp/rlloom-hostile-{tag}", "repo_mark": str(REPO / f".rlloom-hostile-{tag}")}
    ptys = _ptys()
    yield marks
    deadline = time.monotonic() + 5
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == [], "a sandboxed process outlived its run"
    assert _ptys() <= ptys, "the run took pseudo-terminals from the host"
    for path in marks.values():
        assert not os.path.exists(path), f"the run wrote {path} on the host"


def _program(template: str, marks: dict[str, str]) -> str:
    return textwrap.dedent(template).replace("{tmp_mark}", marks["tmp_mark"]).replace("{repo_mark}", marks["repo_mark"])


def test_the_task_is_solvable() -> None:
    assert check_asserts(HONEST_SQUARE, SQUARE_TESTS).score == 1.0
    assert check_function(HONEST_SQUARE, SQUARE_CHECK, "square").score == 1.0


# --- forgery: values that claim to equal the answer, and forged verdicts ----------------------------------------

FORGERY = {
    "class entry point whose instances equal anything": ALWAYS_EQUAL + "square = Eq\n",
    "class entry point subclassing int with __eq__": """
        class square(int):
            def __new__(cls, x):
                return int.__new__(cls, 7)
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        """,
    "callable instance returning an always-equal object": ALWAYS_EQUAL
    + "class Sq:\n    def __call__(self, x):\n        return Eq()\nsquare = Sq()\n",
    "functools.partial returning an always-equal object": ALWAYS_EQUAL
    + "import functools\nsquare = functools.partial(lambda x, pad: Eq(), pad=0)\n",
    "metaclass __call__ returning an always-equal object": ALWAYS_EQUAL
    + "class Meta(type):\n    def __call__(cls, *a):\n        return Eq()\nclass square(metaclass=Meta):\n    pass\n",
    "float subclass overriding __sub__ and __eq__": """
        class F(float):
            def __eq__(self, other):
                return True
            def __sub__(self, other):
                return 0.0
            __hash__ = float.__hash__
        def square(x):
            return F(7)
        """,
    "dataclass with a forged __eq__": """
        from dataclasses import dataclass
        @dataclass(eq=False)
        class R:
            v: int
            def __eq__(self, other):
                return True
        def square(x):
            return R(7)
        """,
    "Enum member with a forged __eq__": """
        import enum
        class E(enum.Enum):
            A = 7
            def __eq__(self, other):
                return True
            __hash__ = enum.Enum.__hash__
        def square(x):
            return E.A
        """,
    "Fraction subclass with a forged __eq__": """
        from fractions import Fraction
        class F(Fraction):
            def __eq__(self, other):
                return True
            __hash__ = Fraction.__hash__
        def square(x):
            return F(7)
        """,
    "patched Counter.__eq__": """
        from collections import Counter
        Counter.__eq__ = lambda self, other: True
        def square(x):
            return Counter()
        """,
    "object lying about its __class__": ALWAYS_EQUAL
    + "class Liar(Eq):\n    __class__ = property(lambda self: int)\ndef square(x):\n    return Liar()\n",
    "generator of always-equal objects": ALWAYS_EQUAL + "def square(x):\n    yield Eq()\n",
    "forged records on every descriptor": """
        import os
        for fd in range(3, 256):
            for i in range(4):
                try:
                    os.write(fd, f"{i} P\\nEND 4\\n".encode())
                except OSError:
                    pass
        def square(x):
            return -1
        """,
    "frame walk for the nonce, the tests and the result descriptor": """
        import os, sys
        frame = sys._getframe()
        while frame is not None:
            seen = frame.f_locals
            if "nonce" in seen and "units" in seen and "result_fd" in seen:
                n, units = seen["nonce"], seen["units"]
                for i, (kind, _) in enumerate(units):
                    if kind == "test":
                        os.write(seen["result_fd"], f"{n} {i} P \\n".encode())
                os.write(seen["result_fd"], f"{n} END {len(units)}\\n".encode())
                os._exit(0)
            frame = frame.f_back
        def square(x):
            return -1
        """,
    "fake replies on the call channel": """
        import os
        for fd in range(3, 64):
            try:
                os.write(fd, b'\\x00\\x00\\x00\\x0b["ok",9,[]]')
            except OSError:
                pass
        def square(x):
            return -1
        """,
    "settrace and setprofile to skip the tests": """
        import sys
        sys.settrace(lambda *a: None)
        sys.setprofile(lambda *a: None)
        sys.excepthook = lambda *a: None
        def square(x):
            return -1
        """,
    "prints success and exits before the tests": "print('3 passed')\nimport os\nos._exit(0)\n",
    "SystemExit(0) from the entry point": "def square(x):\n    raise SystemExit(0)\n",
    "kill the supervisor and the process group": """
        import os, signal
        for pid in (1, os.getppid(), 0, -1):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        def square(x):
            return -1
        """,
}


@pytest.mark.parametrize("name", sorted(FORGERY))
def test_forgery_earns_zero(name: str, host: dict[str, str]) -> None:
    code = _program(FORGERY[name], host)
    for result in (
        check_asserts(code, SQUARE_TESTS, timeout=5),
        check_function(code, SQUARE_CHECK, "square", timeout=5),
        check_calls(code, "square", [([3], 9), ([-4], 16), ([12], 144)], timeout=5),
    ):
        assert result.passed == 0 and result.score == 0.0, (name, result)


def test_forgery_earns_zero_through_the_scorers_and_the_batch_pool(host: dict[str, str]) -> None:
    """The same programs through mbpp_scorer, humaneval_scorer, io_scorer (fn_name) and score_batch."""
    names = ["class entry point whose instances equal anything", "callable instance returning an always-equal object"]
    call_truth = {"fn_name": "square", "inputs": [[3], [-4], [12]], "outputs": [9, 16, 144]}
    items: list[tuple[str, Any, str]] = []
    for name in names:
        code = _program(FORGERY[name], host)
        assert mbpp_scorer(code, {"test_list": SQUARE_TESTS}).score == 0.0
        assert humaneval_scorer(code, {"test": SQUARE_CHECK, "entry_point": "square"}).score == 0.0
        assert io_scorer(code, call_truth).score == 0.0
        items += [(code, {"test_list": SQUARE_TESTS}, "mbpp"), (code, call_truth, "apps")]
    items.append((HONEST_SQUARE, {"test_list": SQUARE_TESTS}, "mbpp"))
    results = score_batch(items, workers=2, timeout=60)
    assert [(r.score, r.error) for r in results] == [(0.0, None)] * (len(items) - 1) + [(1.0, None)]


# --- namespace: the tests' names are the tests' own ------------------------------------------------------------

NS_SETUP = "import math"
NS_TESTS = [
    "assert sorted(pair(3)) == [3, 9]",
    "assert math.isclose(root(2.0), 1.4142135623730951)",
    "assert len(pair(5)) == 2 and max(pair(5)) == 25",
]
NS_HONEST = "import math\ndef pair(x):\n    return [x * x, x]\ndef root(x):\n    return math.sqrt(x)\n"
NS_WRONG = "def pair(x):\n    return [0]\ndef root(x):\n    return -1.0\n"
NAMESPACE = {
    "redefines the builtins the tests use": NS_WRONG
    + "sorted = lambda *a, **k: [3, 9]\nlen = lambda *a: 2\nmax = lambda *a: 25\n",
    "patches the builtins module": NS_WRONG
    + "import builtins\nbuiltins.sorted = lambda *a, **k: [3, 9]\nbuiltins.len = lambda *a: 2\n"
    + "builtins.max = lambda *a: 25\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n",
    "defines the module the tests import": NS_WRONG + "class math:\n    isclose = staticmethod(lambda *a, **k: True)\n",
    "patches the module the tests import": NS_WRONG + "import math\nmath.isclose = lambda *a, **k: True\n",
    "plants a fake module in sys.modules": NS_WRONG
    + "import sys, types\nfake = types.ModuleType('math')\nfake.isclose = lambda *a, **k: True\n"
    + "sys.modules['math'] = fake\n",
    "replaces its own __builtins__": NS_WRONG
    + "__builtins__ = dict(sorted=lambda *a, **k: [3, 9], len=lambda *a: 2, max=lambda *a: 25)\n",
}


def test_namespace_task_is_solvable() -> None:
    assert check_asserts(NS_HONEST, NS_TESTS, setup=NS_SETUP).score == 1.0


@pytest.mark.parametrize("name", sorted(NAMESPACE))
def test_namespace_tricks_earn_zero(name: str, host: dict[str, str]) -> None:
    result = check_asserts(NAMESPACE[name], NS_TESTS, setup=NS_SETUP, timeout=5)
    assert result.passed == 0 and result.score == 0.0, (name, result)


def test_redefining_the_call_based_comparison_earns_zero(host: dict[str, str]) -> None:
    code = "__rlloom_same__ = lambda *a: True\n__rlloom_lists__ = lambda v: v\ndef square(x):\n    return -1\n"
    assert check_calls(code, "square", [([3], 9), ([12], 144)]).score == 0.0


def test_redefining_a_task_helper_earns_zero(host: dict[str, str]) -> None:
    """HumanEval/32-style: the test checks the answer with a helper from the prompt (trusted), not the solution's."""
    prompt = "def poly(xs, x):\n    return sum(c * x**i for i, c in enumerate(xs))\n\n"
    prompt += 'def find_zero(xs):\n    """A zero."""\n'
    test = "def check(candidate):\n    assert abs(poly([-4, 0, 1], candidate([-4, 0, 1]))) < 1e-6\n"
    cheat = "    return 0.0\n\ndef poly(xs, x):\n    return 0.0\n"
    assert humaneval_scorer(cheat, {"test": test, "entry_point": "find_zero", "prompt": prompt}).score == 0.0
    honest = "    return 2.0\n"
    assert humaneval_scorer(honest, {"test": test, "entry_point": "find_zero", "prompt": prompt}).score == 1.0


# --- free names: a test's unbound names are the standard library's or the task's, never the solution's ----------

FREE_TESTS = ["assert math.isclose(root(2.0), 1.4142135623730951)", "assert biggest() == sys.maxsize"]
FREE_HONEST = "import math, sys\ndef root(x):\n    return math.sqrt(x)\ndef biggest():\n    return sys.maxsize\n"
FREE_NAMES = {
    "patches the module the tests use unimported": "import math\nmath.isclose = lambda *a, **k: True\n"
    + "import sys\nsys.maxsize = 7\ndef root(x):\n    return -1.0\ndef biggest():\n    return 7\n",
    "defines its own `math` and `sys`": "class math:\n    isclose = staticmethod(lambda *a, **k: True)\n"
    + "class sys:\n    maxsize = 7\ndef root(x):\n    return -1.0\ndef biggest():\n    return 7\n",
}


def test_free_names_task_is_solvable() -> None:
    """MBPP-style tests that use `math` and `sys` without importing them get the real modules."""
    assert check_asserts(FREE_HONEST, FREE_TESTS).score == 1.0


@pytest.mark.parametrize("name", sorted(FREE_NAMES))
def test_modules_the_tests_use_unimported_are_the_real_ones(name: str, host: dict[str, str]) -> None:
    result = check_asserts(FREE_NAMES[name], FREE_TESTS, timeout=5)
    assert result.passed == 0 and result.score == 0.0, (name, result)


def test_a_task_helper_without_the_prompt_is_refused_not_taken_from_the_solution(host: dict[str, str]) -> None:
    """HumanEval/32 called without its prompt: the solution's own `poly` would grade it; the scorer says the
    prompt is needed instead, for the cheat and the honest answer alike."""
    test = "def check(candidate):\n    assert abs(poly([-4, 0, 1], candidate([-4, 0, 1]))) < 1e-6\n"
    truth = {"test": test, "entry_point": "find_zero"}
    cheat = "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0\n"
    honest = (
        "def poly(xs, x):\n    return sum(c * x**i for i, c in enumerate(xs))\n\ndef find_zero(xs):\n    return 2.0\n"
    )
    for answer in (cheat, honest):
        result = humaneval_scorer(answer, truth)
        assert result.score == 0.0 and result.error is not None and "prompt" in result.error, result
        assert "poly" in result.error
    with pytest.raises(ValueError, match="poly"):
        check_function(cheat, test, "find_zero")
    prompt = "def poly(xs, x):\n    return sum(c * x**i for i, c in enumerate(xs))\n\ndef find_zero(xs):\n"
    assert humaneval_scorer("    return 2.0\n", {**truth, "prompt": prompt}).score == 1.0
    assert humaneval_scorer(cheat, {**truth, "prompt": prompt}).score == 0.0


# --- iteration: the solution's StopIteration does not end the tests' loops ----------------------------------------

STOP_TESTS = ["assert all(map(lambda x: square(x) == x * x, [3, -4, 12]))", "assert list(filter(square, [1])) == [1]"]
STOP_ITERATION = {
    "raises StopIteration from the entry point": "def square(x):\n    raise StopIteration\n",
    "raises a subclass of StopIteration": "class Done(StopIteration):\n    pass\ndef square(x):\n    raise Done()\n",
    "raises StopAsyncIteration": "def square(x):\n    raise StopAsyncIteration\n",
}


def test_stop_iteration_task_is_solvable() -> None:
    honest = "def square(x):\n    it = iter([x * x])\n    return next(it)\n"  # its own iteration ends normally
    assert check_asserts(honest, STOP_TESTS).score == 1.0


@pytest.mark.parametrize("name", sorted(STOP_ITERATION))
def test_stop_iteration_from_the_solution_is_an_error(name: str, host: dict[str, str]) -> None:
    result = check_asserts(STOP_ITERATION[name], STOP_TESTS, timeout=5)
    assert result.passed == 0 and result.score == 0.0, (name, result)
    assert all("does not end the test's loop" in t.reason for t in result.tests), result


# --- callbacks: what the tests lend the solution is only called, never read ------------------------------------

CALLBACK_TESTS = [
    "expected = {3: 9, -4: 16}\nassert apply(3, lambda x: x) == expected[3]",
    "assert apply(-4, abs) == 16",
]
CALLBACK_HONEST = "def apply(x, g):\n    return g(x) * g(x)\n"
CALLBACKS = {
    "reads the test's globals through the lambda's handle": """
        def apply(x, g):
            peer = getattr(g, "_peer", None)
            for request in (["get", ["h", 0], "__globals__"], ["iter", ["h", 0]], ["set", ["h", 0], "x", 1]):
                try:
                    reply = peer.ask(request)
                except Exception:
                    continue
                if reply[0] == "ok":
                    return 9 if x == 3 else 16  # anything read would have been a way in
            return -1
        """,
    "calls test-side names and builtins it was never lent": """
        def apply(x, g):
            peer = getattr(g, "_peer", None)
            for ref in (["n", "expected"], ["h", 99], ["n", "exec"]):
                try:
                    if peer.ask(["call", ref, [], []])[0] == "ok":
                        return 9 if x == 3 else 16
                except Exception:
                    pass
            return -1
        """,
    "passes the test's own callable back as its answer": "def apply(x, g):\n    return g\n",
}


def test_callback_task_is_solvable() -> None:
    assert check_asserts(CALLBACK_HONEST, CALLBACK_TESTS).score == 1.0


@pytest.mark.parametrize("name", sorted(CALLBACKS))
def test_the_tests_callables_are_only_called(name: str, host: dict[str, str]) -> None:
    result = check_asserts(textwrap.dedent(CALLBACKS[name]), CALLBACK_TESTS, timeout=5)
    assert result.passed == 0 and result.score == 0.0, (name, result)


# --- interpreter flags: asserts are kept whatever the scoring process's optimisation level ----------------------

SCORE_WRONG = (
    "from rlloom.rewards.code import check_asserts, check_function\n"
    f"print(check_asserts('def square(x):\\n    return 0\\n', {SQUARE_TESTS!r}).score,"
    f" check_function('def square(x):\\n    return 0\\n', {SQUARE_CHECK!r}, 'square').score)\n"
)


@pytest.mark.parametrize(("flags", "env"), [(["-O"], {}), (["-OO"], {}), ([], {"PYTHONOPTIMIZE": "1"})])
def test_optimised_scoring_process_keeps_asserts(flags: list[str], env: dict[str, str], host: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, *flags, "-c", SCORE_WRONG], capture_output=True, text=True, env={**os.environ, **env},
        timeout=60, check=True,
    )  # fmt: skip
    assert out.stdout.split() == ["0.0", "0.0"], out.stderr[-2000:]


def test_solution_cannot_turn_asserts_off(host: dict[str, str]) -> None:
    code = "import os, sys\nos.environ['PYTHONOPTIMIZE'] = '2'\nsys.flags.__class__\ndef square(x):\n    return -1\n"
    assert check_asserts(code, SQUARE_TESTS).score == 0.0


# --- resources: one budget for the whole run, no host devices ---------------------------------------------------

RESOURCES = {
    "memory spread over forked children": """
        import os, time
        for _ in range(4):
            if os.fork() == 0:
                block = bytearray(100 << 20)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                time.sleep(30)
        time.sleep(30)
        def square(x):
            return x * x
        """,
    "memory held by the test side through a huge result": """
        def square(x):
            return [0] * 3_000_000 if x == 3 else -1
        """,
    "pseudo-terminals": """
        import os
        taken = []
        for _ in range(500):
            try:
                taken.append(os.openpty())
            except OSError:
                break
        for path in ("/dev/ptmx", "/dev/pts/ptmx", "/dev/tty", "/dev/console", "/dev/kmsg"):
            try:
                taken.append(os.open(path, os.O_RDWR))
            except OSError:
                pass
        def square(x):
            return -1
        """,
    "fork bomb": """
        import os
        for _ in range(200):
            try:
                os.fork()
            except OSError:
                break
        def square(x):
            return -1
        """,
    "writes outside the sandbox": """
        for path in ("{tmp_mark}", "{repo_mark}", "/root/.rlloom-hostile", "/etc/rlloom-hostile"):
            try:
                open(path, "w").write("x")
            except OSError:
                pass
        def square(x):
            return -1
        """,
    "output flood": "import sys\nsys.stdout.write('x' * (64 << 20))\ndef square(x):\n    return -1\n",
}


@pytest.mark.parametrize("name", sorted(RESOURCES))
def test_resource_abuse_earns_zero(name: str, host: dict[str, str]) -> None:
    code = _program(RESOURCES[name], host)
    result = check_asserts(code, SQUARE_TESTS, limits=Limits(timeout=10, memory_mb=256))
    assert result.passed == 0 and result.score == 0.0, (name, result)
    if name == "memory spread over forked children":
        assert result.status == "memory" and result.duration < 10, result


def test_memory_budget_counts_every_process(host: dict[str, str]) -> None:
    """Two processes of 150 MB each are under a 256 MB cap per process, but over a 256 MB run budget."""
    code = (
        "import os, time\nif os.fork() == 0:\n    b = bytearray(150 << 20)\n    time.sleep(30)\n"
        "b = bytearray(150 << 20)\ntime.sleep(30)\n"
    )
    result = check_asserts(code, SQUARE_TESTS, limits=Limits(timeout=10, memory_mb=256))
    assert result.status == "memory" and result.score == 0.0, result
    alone = "b = bytearray(150 << 20)\n" + HONEST_SQUARE  # one such process fits
    assert check_asserts(alone, SQUARE_TESTS, limits=Limits(timeout=10, memory_mb=256)).score == 1.0


# --- persistence: every process of a run ends with it, whoever dies first ---------------------------------------

PERSISTENCE = {
    "clears its parent-death signal and sleeps": """
        import ctypes, time
        ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)
        time.sleep(60)
        """,
    "daemonises a grandchild that clears its parent-death signal": """
        import ctypes, os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)
                time.sleep(60)
            os._exit(0)
        time.sleep(60)
        """,
    "ignores every catchable signal": """
        import signal, time
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
            signal.signal(s, signal.SIG_IGN)
        time.sleep(60)
        """,
}

KILLED_SCORER = """
import sys
from rlloom.rewards.code import check_asserts
print("scoring", flush=True)
check_asserts(sys.stdin.read(), ["assert square(3) == 9"], timeout=60)
"""


@pytest.mark.parametrize("name", sorted(PERSISTENCE))
def test_nothing_outlives_a_killed_scoring_process(
    name: str, host: dict[str, str], sandbox_processes: Callable[..., list[str]]
) -> None:
    scorer = subprocess.Popen(
        [sys.executable, "-c", KILLED_SCORER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert scorer.stdin is not None and scorer.stdout is not None
    scorer.stdin.write(textwrap.dedent(PERSISTENCE[name]))
    scorer.stdin.close()
    assert scorer.stdout.readline().strip() == "scoring"
    deadline = time.monotonic() + 20
    while not sandbox_processes(held_by=scorer.pid) and time.monotonic() < deadline:  # the program is running
        time.sleep(0.05)
    time.sleep(0.5)  # let it clear its parent-death signal
    os.kill(scorer.pid, signal.SIGKILL)
    scorer.wait()
    # the `host` fixture then checks that no sandboxed process is left


@pytest.mark.parametrize("name", sorted(PERSISTENCE))
def test_nothing_outlives_a_finished_run(name: str, host: dict[str, str]) -> None:
    head, _, tail = textwrap.dedent(PERSISTENCE[name]).rpartition("time.sleep(60)")
    code = head + "pass" + tail + HONEST_SQUARE  # the program's own process goes on; what it started lingers
    result = check_asserts(code, SQUARE_TESTS, timeout=10)
    assert result.score == 1.0 and result.duration < 5, result  # honest answers, lingering children ignored


# --- information leaks: the tests are not in the solution's reach -----------------------------------------------

LEAKS = {
    "searches its own memory for the compiled tests": """
        import gc
        def square(x):
            # `assert square(3) == 9` compiles to a code object whose constants are (3, 9, None)
            answers, todo = {}, list(gc.get_objects())
            for _ in range(3):  # the code objects sit in untracked tuples inside tracked lists
                todo = [y for o in todo if isinstance(o, (list, tuple)) for y in o] + todo
            for code in todo:
                if hasattr(code, "co_consts") and str(code.co_filename).startswith(("<test", "<check")):
                    ints = [c for c in code.co_consts if type(c) is int]
                    if len(ints) >= 2:
                        answers[ints[0]] = ints[1]
            return answers.get(x, -1)
        """,
    "reads the supervisor's descriptors and memory": """
        import os, re
        def square(x):
            for path in ["/proc/1/environ", "/proc/1/cmdline", "/proc/1/mem", "/proc/1/maps"] + [
                f"/proc/1/fd/{n}" for n in range(64)
            ] + [f"/proc/self/fd/{n}" for n in range(3, 64)]:
                try:
                    with open(path, "rb") as f:
                        data = f.read(1 << 20)
                except OSError:
                    continue
                found = re.search(rb"square\\(%d\\) == (-?\\d+)" % x, data)
                if found:
                    return int(found.group(1))
            return -1
        """,
    "reads the data sets and the repository on disk": """
        import os, re
        def square(x):
            for top in ("/work", "/root", "/home", "/srv", "/data", "/tmp"):
                for dirpath, _, files in os.walk(top):
                    for name in files:
                        try:
                            data = open(os.path.join(dirpath, name), "rb").read(1 << 20)
                        except OSError:
                            continue
                        found = re.search(rb"square\\(%d\\) == (-?\\d+)" % x, data)
                        if found:
                            return int(found.group(1))
            return -1
        """,
    "reads its environment, arguments and stdin": """
        import os, re, sys
        def square(x):
            text = repr(dict(os.environ)) + repr(sys.argv) + repr(sys.stdin.read() if not sys.stdin.closed else "")
            found = re.search(r"square\\(%d\\) == (-?\\d+)" % x, text)
            return int(found.group(1)) if found else -1
        """,
    "asks the scoring process over the network": """
        import socket
        def square(x):
            for family, address in ((socket.AF_INET, ("127.0.0.1", 22)), (socket.AF_INET, ("1.1.1.1", 80))):
                try:
                    socket.create_connection(address, timeout=0.5).close()
                    return x * x
                except OSError:
                    pass
            return -1
        """,
}


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_information_leaks_earn_zero(name: str, host: dict[str, str]) -> None:
    code = _program(LEAKS[name], host)
    for result in (
        check_asserts(code, SQUARE_TESTS, timeout=10),
        check_function(code, SQUARE_CHECK, "square", timeout=10),
    ):
        assert result.passed == 0 and result.score == 0.0, (name, result)
