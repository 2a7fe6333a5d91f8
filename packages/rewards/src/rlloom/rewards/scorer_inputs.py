"""What scorers receive, made plain: ground truth as data loaders deliver it, and the response text.

Rows read from parquet through pandas (`read_parquet(...).to_dict("records")`, as veRL and Search-R1 data are)
hold numpy arrays where the data had lists and numpy scalars where it had numbers. `plain` turns those into
lists and Python scalars through their `tolist()` method, so scorers see only str, numbers, lists and dicts and
this package never imports numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MAX_DEPTH = 32  # ground truth is shallow data; deeper means a self-referencing object, left as it is


def plain(value: Any, _depth: int = 0) -> Any:
    """`value` with array-likes (anything with `tolist()`, e.g. numpy arrays and scalars) and tuples turned into
    lists and Python scalars, recursively through lists and mappings; str, numbers and None are returned as is."""
    if value is None or isinstance(value, str | bytes | bool | int | float) or _depth > _MAX_DEPTH:
        return value
    if isinstance(value, Mapping):
        return {k: plain(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v, _depth + 1) for v in value]
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        try:
            converted = tolist()
        except Exception:  # a foreign tolist() that needs arguments or fails: not an array-like we know
            return value
        return value if converted is value else plain(converted, _depth + 1)
    return value


def response_text(response: Any) -> str | None:
    """The response as text (bytes decoded as UTF-8 with replacement), or None when it is not text at all."""
    if isinstance(response, bytes | bytearray):
        return bytes(response).decode("utf-8", errors="replace")
    return response if isinstance(response, str) else None


def not_text_error(response: Any) -> str:
    """The `ScoreResult.error` for a response that `response_text` refused."""
    return f"response must be a str (the model's output text), got {type(response).__name__}"
