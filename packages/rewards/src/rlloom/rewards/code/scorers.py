"""Scorer-protocol wrappers: read the code out of a model's answer and check it with the sandboxed harness.

Each scorer is `(response, ground_truth, *, extra_info=None) -> ScoreResult`, registered by the rewards registry
for the humaneval, mbpp and io data sources. The score is the fraction of tests passed (set
`extra_info["partial"] = False` for all-or-nothing); a timeout, crash or tampering scores 0 with the reason in
`error`, and malformed ground truth raises `ValueError` naming the field, since that is the data set's fault.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from rlloom.rewards.code.harness import CodeResult, check_asserts, check_function, check_io
from rlloom.rewards.code.runner import Limits
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


def _limits(extra_info: Mapping[str, Any] | None, default_timeout: float) -> tuple[Limits, bool]:
    info = extra_info or {}
    limits = Limits(timeout=float(info.get("timeout", default_timeout)), memory_mb=int(info.get("memory_mb", 512)))
    return limits, bool(info.get("partial", True))


def _field(ground_truth: Any, name: str, kind: type, source: str) -> Any:
    if not isinstance(ground_truth, Mapping) or name not in ground_truth:
        raise ValueError(f"{source} ground_truth needs a {name!r} field ({kind.__name__}); got {ground_truth!r:.200}")
    value = ground_truth[name]
    if not isinstance(value, kind):
        raise ValueError(f"{source} ground_truth[{name!r}] must be {kind.__name__}, got {type(value).__name__}")
    return value


def _as_score(result: CodeResult, code: str) -> ScoreResult:
    error = (
        None
        if result.status in ("passed", "failed")
        else f"{result.status}: " + next((t.reason for t in result.tests if not t.passed), "")
    )
    return ScoreResult(
        score=result.score,
        components={"passed": float(result.passed), "total": float(result.total)},
        extracted=code,
        error=error,
        details={"status": result.status, "tests": [t.model_dump() for t in result.tests], "duration": result.duration},
    )


def humaneval_scorer(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    """ground_truth = {"test", "entry_point"}; a completion-style answer is appended to `extra_info["prompt"]`."""
    test = _field(ground_truth, "test", str, "humaneval")
    entry_point = _field(ground_truth, "entry_point", str, "humaneval")
    code = extract_code(response)
    prompt = (extra_info or {}).get("prompt") or ground_truth.get("prompt")
    if isinstance(prompt, str) and prompt:
        defines = re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None
        code = prompt + "\n" + code if defines else prompt + code
    limits, partial = _limits(extra_info, 10.0)
    return _as_score(check_function(code, test, entry_point, limits=limits, partial=partial), code)


def mbpp_scorer(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    """ground_truth = {"test_list": [assert, ...], "test_setup_code": str (optional)}."""
    asserts = _field(ground_truth, "test_list", list, "mbpp")
    setup = ground_truth.get("test_setup_code") or ""
    code = extract_code(response)
    limits, partial = _limits(extra_info, 10.0)
    return _as_score(check_asserts(code, asserts, setup=setup, limits=limits, partial=partial), code)


def io_scorer(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    """ground_truth = {"inputs": [stdin, ...], "outputs": [expected stdout, ...]} (or that object as a JSON string,
    as verl/PRIME code data sets store it); outputs are compared token by token."""
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as exc:
            raise ValueError(f"io ground_truth is a string but not JSON ({exc}); give {{'inputs', 'outputs'}}") from exc
    if isinstance(ground_truth, Mapping) and ground_truth.get("fn_name"):
        raise ValueError(
            "io ground_truth has 'fn_name' (a call-based task); io_scorer runs stdin/stdout programs only: "
            "turn it into asserts and use mbpp_scorer"
        )
    inputs = _field(ground_truth, "inputs", list, "io")
    outputs = _field(ground_truth, "outputs", list, "io")
    if len(inputs) != len(outputs):
        raise ValueError(f"io ground_truth has {len(inputs)} inputs but {len(outputs)} outputs; they must pair up")
    code = extract_code(response)
    limits, partial = _limits(extra_info, 5.0)
    cases = [(_text(i), _text(o)) for i, o in zip(inputs, outputs, strict=True)]
    return _as_score(check_io(code, cases, limits=limits, partial=partial), code)


def _text(value: Any) -> str:
    """A case's stdin or stdout: strings as they are, lists of lines joined (some data sets store them so)."""
    if isinstance(value, list):
        return "\n".join(str(v) for v in value) + "\n"
    return str(value)
