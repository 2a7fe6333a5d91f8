"""Scorer-protocol wrappers: read the code out of a model's answer and check it with the sandboxed harness.

Each scorer is `(response, ground_truth, *, extra_info=None) -> ScoreResult`, registered by the rewards registry
for the humaneval, mbpp and io data sources. The score is the fraction of tests passed (set
`extra_info["partial"] = False` for all-or-nothing); a timeout, crash or tampering scores 0 with the reason in
`error`, and so does malformed ground truth or a response that is not text, with `error` naming the field and
the shape expected (the data set's fault, reported per row rather than raised).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlloom.rewards.code.harness import (
    CodeResult,
    MissingHelpersError,
    check_asserts,
    check_calls,
    check_function,
    check_io,
)
from rlloom.rewards.code.runner import Limits
from rlloom.rewards.scorer_inputs import not_text_error, plain, response_text
from rlloom.rewards.types import ScoreResult

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str:
    """The last ```python (or ```py) block; else the last fenced block of any language; else the whole text."""
    blocks = _FENCE.findall(response)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if python:
        return str(python[-1])
    if blocks:
        return str(blocks[-1][1])
    return response


class _RunOptions(BaseModel):
    """The `extra_info` knobs of a code scorer, validated: `bool("false")` is True, so a string "false" from a
    JSON or parquet row would silently keep partial credit; a bad value is reported per row instead."""

    model_config = ConfigDict(extra="ignore")

    timeout: float | None = Field(default=None, gt=0, le=3600)  # None: the scorer's default
    memory_mb: int | None = Field(default=None, ge=64)  # None: 512
    partial: bool | None = None  # None: True
    float_tolerance: float | None = Field(default=None, ge=0, lt=1)  # io only; None: tokens compare exactly
    time_budget: float | None = Field(default=None, gt=0, le=3600)  # io only; None: IO_TIME_BUDGET


IO_TIME_BUDGET = 20.0
"""Seconds all of one io task's cases may take together, by default: below `score_batch`'s 30 s item deadline,
so that a slow program fails its remaining cases instead of being killed with its worker as a scorer timeout
(which a trainer counts as its reward pipeline failing). Raise both together for long tasks."""


def _options(extra_info: Mapping[str, Any] | None) -> _RunOptions:
    """The validated knobs; raises ValueError naming the bad key and what it accepts."""
    try:
        return _RunOptions.model_validate(dict(plain(extra_info or {})))
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        name = ".".join(str(part) for part in first["loc"])
        raise ValueError(
            f"extra_info[{name!r}]={first['input']!r}: {first['msg']} (timeout, time_budget: seconds in (0, 3600]; "
            "memory_mb: an integer >= 64; partial: true/false; float_tolerance: a number in [0, 1))"
        ) from None


def _limits(extra_info: Mapping[str, Any] | None, default_timeout: float) -> tuple[Limits, bool]:
    """(limits, partial) from `extra_info`; raises ValueError naming the bad key and what it accepts."""
    options = _options(extra_info)
    timeout = options.timeout if options.timeout is not None else default_timeout
    memory_mb = options.memory_mb if options.memory_mb is not None else 512
    return Limits(timeout=timeout, memory_mb=memory_mb), options.partial is not False


def _field(ground_truth: Any, name: str, kind: type, source: str) -> Any:
    if not isinstance(ground_truth, Mapping) or name not in ground_truth:
        raise ValueError(f"{source} ground_truth needs a {name!r} field ({kind.__name__}); got {ground_truth!r:.200}")
    value = ground_truth[name]
    if not isinstance(value, kind):
        raise ValueError(f"{source} ground_truth[{name!r}] must be {kind.__name__}, got {type(value).__name__}")
    return value


def _as_score(result: CodeResult, code: str) -> ScoreResult:
    """The program's verdict as a score. However the candidate ended (a syntax error, a timeout, a memory or
    output cap, tampering), that is the model's failure and scores what it passed, not a scoring error: a trainer
    counts `error` as its reward pipeline failing (and stops when a whole step fails), and an eval warns that its
    figures understate the model. How it ended is in `details["status"]` and `details["reason"]`."""
    reason = "" if result.status in ("passed", "failed") else next((t.reason for t in result.tests if not t.passed), "")
    return ScoreResult(
        score=result.score,
        components={"passed": float(result.passed), "total": float(result.total)},
        extracted=code,
        details={
            "status": result.status,
            "reason": reason,
            "tests": [t.model_dump() for t in result.tests],
            "duration": result.duration,
        },
    )


def _scored(check: Callable[[], CodeResult], code: str) -> ScoreResult:
    """Run a check; a ValueError is the harness refusing the data set's tests (the candidate runs sandboxed and
    never raises here), so it scores 0 with the message instead of raising for one bad row."""
    try:
        return _as_score(check(), code)
    except MissingHelpersError as exc:
        return ScoreResult(score=0.0, extracted=code, error=f"missing prompt: {exc}")
    except ValueError as exc:
        return ScoreResult(score=0.0, extracted=code, error=f"bad ground_truth: {exc}")


def humaneval_scorer(response: Any, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    """ground_truth = {"test", "entry_point"}; a completion-style answer is appended to `extra_info["prompt"]`
    (or `ground_truth["prompt"]`). The prompt is required when the tests use helpers it defines (HumanEval/32's
    `poly`): without it the result is a 0 with `error` saying so, never the solution's own `poly`."""
    text, ground_truth = response_text(response), plain(ground_truth)
    if text is None:
        return ScoreResult(score=0.0, error=not_text_error(response))
    try:
        test = _field(ground_truth, "test", str, "humaneval")
        entry_point = _field(ground_truth, "entry_point", str, "humaneval")
        limits, partial = _limits(extra_info, 10.0)
    except ValueError as exc:
        return ScoreResult(score=0.0, error=str(exc))
    code = extract_code(text)
    prompt = (extra_info or {}).get("prompt") or ground_truth.get("prompt")
    helpers = prompt if isinstance(prompt, str) else ""
    if helpers:  # the prompt also runs on the test side: helpers the tests call (`poly`) are the task's own
        defines = re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None
        code = helpers + "\n" + code if defines else helpers + code
    return _scored(
        lambda: check_function(code, test, entry_point, limits=limits, partial=partial, helpers=helpers), code
    )


def mbpp_scorer(response: Any, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    """ground_truth = {"test_list": [assert, ...], "test_setup_code": str (optional)}."""
    text, ground_truth = response_text(response), plain(ground_truth)
    if text is None:
        return ScoreResult(score=0.0, error=not_text_error(response))
    try:
        asserts = _field(ground_truth, "test_list", list, "mbpp")
        setup = ground_truth.get("test_setup_code") or ""
        if not isinstance(setup, str):
            raise ValueError(f"mbpp ground_truth['test_setup_code'] must be str, got {type(setup).__name__}")
        limits, partial = _limits(extra_info, 10.0)
    except ValueError as exc:
        return ScoreResult(score=0.0, error=str(exc))
    code = extract_code(text)
    return _scored(lambda: check_asserts(code, asserts, setup=setup, limits=limits, partial=partial), code)


def _io_task(ground_truth: Any) -> tuple[list[Any], list[Any], str | None]:
    """(inputs, outputs, fn_name or None) of an io ground truth, which may be a JSON string (verl/PRIME)."""
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as exc:
            raise ValueError(f"io ground_truth is a string but not JSON ({exc}); give {{'inputs', 'outputs'}}") from exc
    ground_truth = plain(ground_truth)
    inputs = _field(ground_truth, "inputs", list, "io")
    outputs = _field(ground_truth, "outputs", list, "io")
    if len(inputs) != len(outputs):
        raise ValueError(f"io ground_truth has {len(inputs)} inputs but {len(outputs)} outputs; they must pair up")
    fn_name = ground_truth.get("fn_name") or None
    if fn_name is None:
        return inputs, outputs, None
    if not (isinstance(fn_name, str) and fn_name.isidentifier()):
        raise ValueError(f"io ground_truth['fn_name'] must be a Python function name, got {fn_name!r:.100}")
    for i, args in enumerate(inputs):
        if not isinstance(args, list):
            raise ValueError(
                f"io ground_truth has 'fn_name', so each input is a list of arguments; inputs[{i}] is a "
                f"{type(args).__name__}"
            )
    return inputs, outputs, fn_name


def io_scorer(response: Any, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    """ground_truth = {"inputs": [stdin, ...], "outputs": [expected stdout, ...]} (or that object as a JSON string,
    as verl/PRIME code data sets store it); outputs are compared token by token and `timeout` is per case, all
    cases together within `time_budget` (default `IO_TIME_BUDGET`); `float_tolerance` (e.g. 1e-6) accepts floats
    within that absolute or relative error, as APPS and veRL's prime_code do.

    With "fn_name" (call-based APPS/TACO tasks) each input is a list of arguments and each output the expected
    return value, checked as veRL's prime_code does (see `check_calls`) in one run that `timeout` bounds.
    """
    text = response_text(response)
    if text is None:
        return ScoreResult(score=0.0, error=not_text_error(response))
    try:
        inputs, outputs, fn_name = _io_task(ground_truth)
        limits, partial = _limits(extra_info, 10.0 if fn_name is not None else 5.0)
    except ValueError as exc:
        return ScoreResult(score=0.0, error=str(exc))
    code = extract_code(text)
    if fn_name is not None:
        calls = list(zip(inputs, outputs, strict=True))
        return _scored(lambda: check_calls(code, fn_name, calls, limits=limits, partial=partial), code)
    cases = [(_text(i), _text(o)) for i, o in zip(inputs, outputs, strict=True)]
    options = _options(extra_info)
    budget = options.time_budget if options.time_budget is not None else IO_TIME_BUDGET
    return _scored(
        lambda: check_io(
            code, cases, limits=limits, partial=partial, float_tolerance=options.float_tolerance, time_budget=budget
        ),
        code,
    )


def _text(value: Any) -> str:
    """A case's stdin or stdout: strings as they are, lists of lines joined (some data sets store them so)."""
    if isinstance(value, list):
        return "\n".join(str(v) for v in value) + "\n"
    return str(value)
