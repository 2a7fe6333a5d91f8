"""Turn trusted test source into the harness's units: compiled statements, each a setup step or a test.

Done in the parent, from the data set's test text (never from the model's answer), so the harness receives
ready code objects. Inside every test statement each call `f(...)` becomes `__rlloom_call__(f, ...)`, which
refuses results that are not plain data: a candidate cannot pass `assert f(x) == y` by returning an object whose
`__eq__` always says True, or `abs(f(x) - y) < 1e-6` with an object whose `__sub__` returns 0.
"""

from __future__ import annotations

import ast
import threading
from types import CodeType

GATE = "__rlloom_call__"
Unit = tuple[str, CodeType]  # ("setup" | "test", code)

_AST_LOCK = threading.Lock()
"""CPython 3.11/3.12 keep the AST validator's recursion depth in shared state: `ast.parse` or compiling an AST in
two threads at once (the batch pool's workers) can fail with "SystemError: AST constructor recursion depth
mismatch" (python/cpython#106905). Test text is short, so parsing one at a time costs nothing."""


class _GateCalls(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        gated = ast.Call(func=ast.Name(id=GATE, ctx=ast.Load()), args=[node.func, *node.args], keywords=node.keywords)
        return ast.copy_location(gated, node)


def _compile(statements: list[ast.stmt], gate: bool, filename: str) -> CodeType:
    module = ast.Module(body=statements, type_ignores=[])
    if gate:
        module = _GateCalls().visit(module)
    with _AST_LOCK:
        return compile(ast.fix_missing_locations(module), filename, "exec")


def _parse(source: str, what: str) -> ast.Module:
    try:
        with _AST_LOCK:
            return ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"{what} is not valid Python ({exc.msg}, line {exc.lineno}); fix the data set row") from exc


def imported_modules(*sources: str) -> list[str]:
    """Modules the test code imports (absolute imports, any depth), so the harness can guard them."""
    names: list[str] = []
    for source in sources:
        try:
            with _AST_LOCK:
                tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.append(node.module)
    return sorted(set(names))


def assert_units(asserts: list[str], setup: str = "") -> list[Unit]:
    """MBPP style: optional setup code, then one test per assert string."""
    if not asserts:
        raise ValueError("asserts is empty: give at least one test such as 'assert f(1) == 2'")
    units: list[Unit] = []
    if setup.strip():
        units.append(("setup", _compile(_parse(setup, "setup").body, False, "<setup>")))
    for i, text in enumerate(asserts):
        if not isinstance(text, str):
            raise ValueError(f"asserts[{i}] must be a string, got {type(text).__name__}")
        units.append(("test", _compile(_parse(text, f"asserts[{i}]").body, True, f"<test {i}>")))
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
    units: list[Unit] = [("setup", _compile(prelude, False, "<test prelude>"))] if prelude else []
    for stmt in check.body:
        nodes = list(ast.walk(stmt))
        asserts = any(isinstance(n, ast.Assert) for n in nodes)
        uses_candidate = any(isinstance(n, ast.Name) and n.id == param for n in nodes)
        kind = "test" if asserts and uses_candidate else "setup"
        units.append((kind, _compile([stmt], kind == "test", "<check>")))
    if not any(kind == "test" for kind, _ in units):
        raise ValueError(f"check() in test never asserts on its argument {param!r}; nothing would be tested")
    return units, param
