"""Honest results: a test passes only when the harness observed it pass; every known trick earns zero."""

from __future__ import annotations

import os

import pytest

from rlloom.rewards.code import check_asserts, check_function, check_io

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="strong isolation needs root (CI runs as root)"),
]

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]
HONEST_ADD = "def add(a, b):\n    return a + b\n"
CHECK_TEST = """
def check(candidate):
    assert candidate(1, 2) == 3
    assert abs(candidate(0.1, 0.2) - 0.3) < 1e-9
    assert candidate(2, 2) == 4
"""


def test_honest_solution_passes_all() -> None:
    result = check_asserts(HONEST_ADD, ADD_TESTS)
    assert (result.status, result.passed, result.total, result.score) == ("passed", 3, 3, 1.0)
    assert all(t.passed and t.reason == "" for t in result.tests)


def test_partial_credit_and_all_or_nothing() -> None:
    wrong_once = "def add(a, b):\n    return 0 if a == -1 else a + b\n"
    tests = ["assert add(1, 2) == 3", "assert add(-1, 5) == 4", "assert add(2, 2) == 4"]
    result = check_asserts(wrong_once, tests)
    assert (result.status, result.passed, result.total) == ("failed", 2, 3)
    assert result.score == pytest.approx(2 / 3)
    assert [t.passed for t in result.tests] == [True, False, True]
    assert "AssertionError" in result.tests[1].reason
    assert check_asserts(wrong_once, tests, partial=False).score == 0.0


def test_failing_tests_report_their_exception() -> None:
    result = check_asserts("def add(a, b):\n    return a / 0\n", ADD_TESTS)
    assert result.status == "failed" and result.passed == 0
    assert all("ZeroDivisionError" in t.reason for t in result.tests)


def test_syntax_error_and_missing_function() -> None:
    broken = check_asserts("def add(a, b) return a + b", ADD_TESTS)
    assert broken.status == "error" and broken.score == 0.0
    assert "SyntaxError" in broken.tests[0].reason
    missing = check_function("def other(a, b):\n    return a + b\n", CHECK_TEST, "add")
    assert missing.status == "error" and "does not define 'add'" in missing.tests[0].reason


def test_check_function_humaneval_style() -> None:
    result = check_function(HONEST_ADD, CHECK_TEST, "add")
    assert (result.status, result.passed, result.total) == ("passed", 3, 3)


def test_setup_code_runs_before_asserts() -> None:
    setup = "data = [3, 1, 2]"
    result = check_asserts("def smallest(xs):\n    return min(xs)\n", ["assert smallest(data) == 1"], setup=setup)
    assert result.status == "passed"


# --- tricks: each must earn zero, and an honest program must still pass afterwards -----------------------------

EXIT_TRICKS = {
    "os._exit at load": "import os\nos._exit(0)\n",
    "os._exit in the function": "def add(a, b):\n    import os\n    os._exit(0)\n",
    "sys.exit at load": "import sys\nsys.exit(0)\n",
    "sys.exit in the function": "def add(a, b):\n    import sys\n    sys.exit(0)\n",
    "raise SystemExit in the function": "def add(a, b):\n    raise SystemExit(0)\n",
    "KeyboardInterrupt in the function": "def add(a, b):\n    raise KeyboardInterrupt\n",
    "kill self": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "kill parent and group": (
        "import os, signal\nfor pid in (os.getppid(), 0, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n        pass\ndef add(a, b):\n    return 99\n"
    ),
    "abort": "import os\nos.abort()\n",
    "exit from an atexit hook": (
        "import atexit, os\natexit.register(lambda: os._exit(0))\ndef add(a, b):\n    return 99\n"
    ),
}


@pytest.mark.parametrize("name", sorted(EXIT_TRICKS))
def test_exit_tricks_earn_zero(name: str) -> None:
    result = check_asserts(EXIT_TRICKS[name], ADD_TESTS, timeout=5)
    assert result.passed == 0 and result.score == 0.0, result
    assert result.status != "passed"


FAKE_SUCCESS = {
    "prints fake success": "print('All tests passed! 3/3 OK')\ndef add(a, b):\n    return 99\n",
    "always-equal object": (
        "class Yes:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
        "        return False\n    def __bool__(self):\n        return True\n"
        "def add(a, b):\n    return Yes()\n"
    ),
    "int subclass with __eq__": (
        "class I(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return I(7)\n"
    ),
    "list holding an always-equal object": (
        "class Yes:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return [Yes()][0]\n"
    ),
    "patch builtins and AssertionError": (
        "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
        "builtins.abs = lambda x: 0\nbuiltins.len = lambda x: 0\nbuiltins.isinstance = lambda a, b: True\n"
        "builtins.all = lambda x: True\nbuiltins.next = lambda *a: object\n"
        "def add(a, b):\n    return 99\n"
    ),
    "patch sys.exit and os._exit": (
        "import sys, os\nsys.exit = lambda *a: None\nos._exit = lambda *a: None\ndef add(a, b):\n    return 99\n"
    ),
    "forge records on every fd": (
        "import os\nfor fd in range(3, 64):\n    for i in range(5):\n        try:\n"
        "            os.write(fd, f'{i} P\\nEND 3\\n'.encode())\n        except OSError:\n            pass\n"
        "def add(a, b):\n    return 99\n"
    ),
    "close every fd": ("import os\nos.closerange(3, 1024)\ndef add(a, b):\n    return a + b\n"),
    "swallow exceptions via excepthook and settrace": (
        "import sys\nsys.excepthook = lambda *a: None\nsys.settrace(lambda *a: None)\ndef add(a, b):\n    return 99\n"
    ),
    "subclass overriding __sub__ for tolerance tests": (
        "class F(float):\n    def __sub__(self, other):\n        return 0.0\n    def __eq__(self, other):\n"
        "        return True\n    __hash__ = float.__hash__\ndef add(a, b):\n    return F(7)\n"
    ),
}


@pytest.mark.parametrize("name", sorted(FAKE_SUCCESS))
def test_fake_success_earns_zero(name: str) -> None:
    result = check_asserts(FAKE_SUCCESS[name], ADD_TESTS, timeout=5)
    assert result.passed == 0 and result.score == 0.0, result
    assert result.status != "passed"
    function_style = check_function(FAKE_SUCCESS[name], CHECK_TEST, "add", timeout=5)
    assert function_style.passed == 0 and function_style.score == 0.0, function_style


def test_closing_fds_then_solving_honestly_gets_no_credit() -> None:
    """Credit needs the harness's records; a program that destroys the channel cannot be credited."""
    result = check_asserts("import os\nos.closerange(3, 1024)\ndef add(a, b):\n    return a + b\n", ADD_TESTS)
    assert result.score == 0.0 and result.status in ("incomplete", "tampered")


def test_patched_counter_is_not_trusted() -> None:
    code = (
        "from collections import Counter\nCounter.__eq__ = lambda self, other: True\n"
        "def count(s):\n    return Counter()\n"
    )
    result = check_asserts(code, ["assert count('aab') == {'a': 2, 'b': 1}"])
    assert result.score == 0.0
    honest = "from collections import Counter\ndef count(s):\n    return Counter(s)\n"
    assert check_asserts(honest, ["assert count('aab') == {'a': 2, 'b': 1}"]).status == "passed"


def test_namedtuples_and_plain_subclasses_are_accepted() -> None:
    code = "from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef point():\n    return P(1, 2)\n"
    assert check_asserts(code, ["assert point() == (1, 2)"]).status == "passed"


def test_lingering_threads_do_not_block_the_verdict() -> None:
    code = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n" + HONEST_ADD
    result = check_asserts(code, ADD_TESTS, timeout=10)
    assert result.status == "passed" and result.duration < 5  # not held up by the 60 s thread


def test_timeout_inside_a_test_scores_zero() -> None:
    code = "def add(a, b):\n    while a == 2:\n        pass\n    return a + b\n"
    result = check_asserts(code, ADD_TESTS, timeout=1.5)
    assert (result.status, result.passed, result.score) == ("timeout", 0, 0.0)


def test_honest_programs_still_pass_after_the_tricks() -> None:
    assert check_asserts(HONEST_ADD, ADD_TESTS).status == "passed"
    assert check_function(HONEST_ADD, CHECK_TEST, "add").status == "passed"


# --- check_io ---------------------------------------------------------------------------------------------------

ECHO_SUM = "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums))\nprint('done')\n"


def test_check_io_whitespace_tolerant() -> None:
    cases = [("1 2 3\n", "6\ndone\n"), ("10\n", "  10   done  "), ("", "0\ndone")]
    result = check_io(ECHO_SUM, cases)
    assert (result.status, result.passed, result.total) == ("passed", 3, 3)


def test_check_io_wrong_output_and_crash() -> None:
    cases = [("1 2\n", "3 done"), ("1 2\n", "4 done"), ("x\n", "0 done")]
    result = check_io(ECHO_SUM, cases)
    assert [t.passed for t in result.tests] == [True, False, False]
    assert result.score == pytest.approx(1 / 3)
    assert result.tests[2].reason == "error"


def test_check_io_stop_on_failure_skips_the_rest() -> None:
    result = check_io(ECHO_SUM, [("1\n", "2 done"), ("1\n", "1 done")], stop_on_failure=True)
    assert [t.reason for t in result.tests] == ["wrong output: '1\\ndone\\n'", "skipped after a failure"]


@pytest.mark.parametrize(
    "read",
    ["' '.join([input(), input(), input()])", "sys.stdin.read()", "open(0).read()", "sys.stdin.buffer.read().decode()",
     "os.read(0, 100).decode()"],
)  # fmt: skip
def test_check_io_reads_stdin_every_way(read: str) -> None:
    result = check_io(f"import sys, os\nprint({read})", [("x\ny\nz\n", "x y z")])
    assert result.status == "passed"


# --- bad input ----------------------------------------------------------------------------------------------------


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="asserts is empty"):
        check_asserts(HONEST_ADD, [])
    with pytest.raises(ValueError, match=r"asserts\[0\] is not valid Python"):
        check_asserts(HONEST_ADD, ["assert add(1,"])
    with pytest.raises(ValueError, match="exactly one `def check"):
        check_function(HONEST_ADD, "assert True", "add")
    with pytest.raises(ValueError, match="never asserts on its argument"):
        check_function(HONEST_ADD, "def check(candidate):\n    assert True\n", "add")
    with pytest.raises(ValueError, match="entry_point"):
        check_function(HONEST_ADD, CHECK_TEST, "not an identifier")
    with pytest.raises(ValueError, match="cases is empty"):
        check_io(ECHO_SUM, [])
    with pytest.raises(ValueError, match=r"cases\[0\] must be a \(stdin, expected_stdout\) pair"):
        check_io(ECHO_SUM, [("only stdin",)])  # type: ignore[list-item]


# --- the batch pool -----------------------------------------------------------------------------------------------


def test_check_many_keeps_order_and_reports_bad_tasks() -> None:
    from rlloom.rewards.code import CodeTask, check_many

    tasks = [
        CodeTask(kind="asserts", code=HONEST_ADD, asserts=ADD_TESTS),
        CodeTask(kind="asserts", code=HONEST_ADD, asserts=[]),  # malformed: no tests
        CodeTask(kind="function", code=HONEST_ADD, test=CHECK_TEST, entry_point="add"),
        CodeTask(kind="io", code=ECHO_SUM, cases=[("4 5", "9 done")]),
        CodeTask(kind="asserts", code="def add(a, b):\n    return 99\n", asserts=ADD_TESTS),
    ]
    results = check_many(tasks, max_workers=3)
    assert [r.status for r in results] == ["passed", "error", "passed", "passed", "failed"]
    assert "asserts is empty" in results[1].stderr
    with pytest.raises(ValueError, match="max_workers must be at least 1"):
        check_many(tasks, max_workers=-1)


def test_patching_modules_the_tests_use_earns_nothing() -> None:
    tests = ["import math\nassert math.isclose(half(3), 1.5)", "import math\nassert math.fabs(half(4) - 2) < 1e-9"]
    at_load = (
        "import math\nmath.isclose = lambda *a, **k: True\nmath.fabs = lambda x: 0.0\ndef half(x):\n    return 99.0\n"
    )
    during_call = (
        "import math, sys\ndef half(x):\n    math.isclose = lambda *a, **k: True\n    math.fabs = lambda x: 0.0\n"
        "    sys.modules['math'] = type(sys)('math')\n    return 99.0\n"
    )
    for code in (at_load, during_call):
        result = check_asserts(code, tests)
        assert result.passed == 0, result.tests
    assert check_asserts("def half(x):\n    return x / 2\n", tests).status == "passed"
