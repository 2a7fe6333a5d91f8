"""Turn trusted test source into the harness's units: compiled statements, each a helper, setup step or test.

Done in the parent, from the data set's test text (never from the model's answer), so the harness receives
ready code objects. They are compiled with `optimize=0` whatever this interpreter's flags: under `python -O` or
PYTHONOPTIMIZE the default would drop every `assert`, and every wrong answer would pass. `solution_names` lists
the names the tests read but never bind (and that are not builtins): the only names the test namespace takes
from the solution, except standard-library modules the tests use without importing them (MBPP's `math.`,
`sys.`), which are the real modules. A test statement with an identity comparison (`is`, other than against
None, True, False) is compiled with a filename ending in " (is)", so its failure can say why.
"""

from __future__ import annotations

import ast
import builtins
import sys
import threading
from types import CodeType

Unit = tuple[str, CodeType]  # ("helper" | "setup" | "test", code)

_AST_LOCK = threading.Lock()
"""CPython 3.11/3.12 keep the AST validator's recursion depth in shared state: `ast.parse` or compiling an AST in
two threads at once (the batch pool's workers) can fail with "SystemError: AST constructor recursion depth
mismatch" (python/cpython#106905). Test text is short, so parsing one at a time costs nothing."""


def _identity(statements: list[ast.stmt]) -> bool:
    """Whether the statements compare identities (`a is b`) other than against None, True, False or `...`."""
    for stmt in statements:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                for i, op in enumerate(node.ops):
                    pair = operands[i : i + 2]
                    constant = any(isinstance(v, ast.Constant) and v.value in (None, True, False, ...) for v in pair)
                    if isinstance(op, ast.Is | ast.IsNot) and not constant:
                        return True
    return False


def _compile(statements: list[ast.stmt], filename: str) -> CodeType:
    if _identity(statements):
        filename += " (is)"
    module = ast.Module(body=statements, type_ignores=[])
    with _AST_LOCK:
        return compile(ast.fix_missing_locations(module), filename, "exec", dont_inherit=True, optimize=0)


def _parse(source: str, what: str) -> ast.Module:
    try:
        with _AST_LOCK:
            return ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"{what} is not valid Python ({exc.msg}, line {exc.lineno}); fix the data set row") from exc


def _bound_and_read(tree: ast.AST) -> tuple[set[str], set[str]]:
    bound: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
    return bound, read


def _module_like(trees: list[ast.AST]) -> set[str]:
    """Names read only as `name.attribute` (as a module is), never called, passed or compared themselves."""
    based: set[str] = set()
    other: set[str] = set()
    for tree in trees:
        as_base = {
            id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                (based if id(node) in as_base else other).add(node.id)
    return based - other


def solution_names(*sources: str) -> tuple[list[str], list[str], list[str]]:
    """(names, builtin_names, modules): what the test code expects the solution to define, and the
    standard-library modules it uses without importing them.

    `names` are read and never bound by the tests, builtins excepted: a builtin name means the builtin (a solution
    cannot redefine `sorted` for the tests), and a module the tests import is theirs. A free name that is a
    standard-library module and that the tests only use as one (`math.sqrt(2)`, never `math(2)`) is in `modules`
    instead: the real module, never the solution's (MBPP's tests use `sys` and `math` unimported). The one exception
    is a test statement that reads builtin names only (MBPP's `assert sum(10, 15) == 6`, whose entry point is
    named `sum`): the names it calls are `builtin_names`, taken from the solution when it defines them.
    """
    bound: set[str] = set()
    read: set[str] = set()
    trees: list[ast.AST] = []
    statements: list[ast.stmt] = []
    for source in sources:
        try:
            with _AST_LOCK:
                tree = ast.parse(source)
        except SyntaxError:
            continue
        trees.append(tree)
        more_bound, more_read = _bound_and_read(tree)
        bound |= more_bound
        read |= more_read
        for stmt in tree.body:
            statements.extend(stmt.body if isinstance(stmt, ast.FunctionDef) else [stmt])
    builtin = set(dir(builtins))
    shadowed: set[str] = set()
    for stmt in statements:
        stmt_read = _bound_and_read(stmt)[1]
        if stmt_read and all(name in builtin and name not in bound for name in stmt_read):
            calls = (n.func for n in ast.walk(stmt) if isinstance(n, ast.Call))
            shadowed |= {f.id for f in calls if isinstance(f, ast.Name)}
    free = read - bound - builtin
    modules = {n for n in free & _module_like(trees) if n in sys.stdlib_module_names and not n.startswith("_")}
    return sorted(free - modules), sorted(shadowed), sorted(modules)


def defined_names(helpers: str) -> set[str]:
    """Every name trusted helpers bind (functions, classes, assignments, imports): what they provide the tests."""
    tree = _parse_helpers(helpers)
    return _bound_and_read(tree)[0] if tree is not None else set()


def _parse_helpers(helpers: str) -> ast.Module | None:
    """The helpers' syntax tree; a prompt that stops at the entry point's signature (no docstring, so no body)
    gets a `pass` body; None if it still does not parse."""
    if not helpers.strip():
        return None
    for source in (helpers, helpers.rstrip() + "\n    pass\n"):
        try:
            with _AST_LOCK:
                return ast.parse(source)
        except SyntaxError:
            continue
    return None


def helper_units(helpers: str) -> list[Unit]:
    """Trusted code shipped with the task (HumanEval's prompt) run first on the test side: the helpers it defines
    (`poly` for find_zero, `encode_cyclic` ...) are the task's, not the solution's. Empty if it does not parse."""
    tree = _parse_helpers(helpers)
    return [("helper", _compile(tree.body, "<helpers>"))] if tree is not None else []


def assert_units(asserts: list[str], setup: str = "") -> list[Unit]:
    """MBPP style: optional setup code, then one test per assert string."""
    if not asserts:
        raise ValueError("asserts is empty: give at least one test such as 'assert f(1) == 2'")
    units: list[Unit] = []
    if setup.strip():
        units.append(("setup", _compile(_parse(setup, "setup").body, "<setup>")))
    for i, text in enumerate(asserts):
        if not isinstance(text, str):
            raise ValueError(f"asserts[{i}] must be a string, got {type(text).__name__}")
        units.append(("test", _compile(_parse(text, f"asserts[{i}]").body, f"<test {i}>")))
    return units


def function_units(test: str, entry_point: str) -> tuple[list[Unit], str]:
    """HumanEval style: `def check(candidate)` whose top-level statements that assert on the candidate are tests.

    Returns the units and the name of check's parameter (bound to the solution's `entry_point` by the harness).
    Statements that assert nothing about the candidate (imports, helper values, `assert True`) run as setup.
    """
    if not entry_point.isidentifier():
        raise ValueError(f"entry_point {entry_point!r} is not a Python identifier")
    module = _parse(test, "test")
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1 or len(checks[0].args.args) != 1:
        raise ValueError("test must define exactly one `def check(candidate):` taking one argument")
    check = checks[0]
    param = check.args.args[0].arg
    prelude = [n for n in module.body if n is not check]
    units: list[Unit] = [("setup", _compile(prelude, "<test prelude>"))] if prelude else []
    for stmt in check.body:
        nodes = list(ast.walk(stmt))
        asserts = any(isinstance(n, ast.Assert) for n in nodes)
        uses_candidate = any(isinstance(n, ast.Name) and n.id == param for n in nodes)
        kind = "test" if asserts and uses_candidate else "setup"
        units.append((kind, _compile([stmt], "<check>")))
    if not any(kind == "test" for kind, _ in units):
        raise ValueError(f"check() in test never asserts on its argument {param!r}; nothing would be tested")
    return units, param
