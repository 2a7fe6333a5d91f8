"""Score one response with a scorer chosen by callable, registry name / import spec, or the row's data_source.

Shared by the adapters: each peer hands over one row at a time with its own names for the fields, and each wants
a failure to cost one reward, not the training step. A scorer that raises scores 0 with the exception as `error`;
a name that resolves to no scorer is a configuration mistake and raises `ScorerLoadError` at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from rlloom.rewards.registry import DEFAULT_SCORERS, ScorerLoadError, get_scorer, is_async_scorer, to_result
from rlloom.rewards.types import ScoreResult

ScorerLike = Callable[..., Any] | str


def resolve(scorer: ScorerLike | None, data_source: str | None, *, how: str) -> tuple[Callable[..., Any], str]:
    """The scorer function and its display name: `scorer` when given, else the registry's for `data_source`.

    `how` tells the user how to pass a scorer in the peer's terms when neither is usable.
    """
    if scorer is not None and not isinstance(scorer, str):
        return scorer, getattr(scorer, "__name__", type(scorer).__name__)
    name = scorer if scorer is not None else data_source
    if not name:
        raise ScorerLoadError(f"no scorer and no data_source for this row; {how}")
    try:
        return get_scorer(str(name)), str(name)
    except ScorerLoadError as exc:
        if scorer is not None:
            raise
        known = ", ".join(sorted(DEFAULT_SCORERS))
        raise ScorerLoadError(
            f"data_source {name!r} has no rlloom scorer (known: {known}); register one with "
            f"rlloom.rewards.register({name!r}, 'module:function') or {how}"
        ) from exc


def _failed(exc: BaseException) -> ScoreResult:
    return ScoreResult(score=0.0, error=f"{type(exc).__name__}: {exc}", details={"error_kind": "exception"})


def score_now(
    fn: Callable[..., Any], name: str, response: str, ground_truth: Any, extra_info: Mapping[str, Any] | None
) -> ScoreResult:
    """Score in this thread (an async scorer runs on a private event loop); an exception becomes a 0 with `error`."""
    try:
        value = fn(response, ground_truth, extra_info=dict(extra_info or {}))
        if asyncio.iscoroutine(value):
            value = asyncio.run(value)
        return to_result(value, scorer=name)
    except Exception as exc:  # one broken row costs its reward, never the step
        return _failed(exc)


async def score_async(
    fn: Callable[..., Any], name: str, response: str, ground_truth: Any, extra_info: Mapping[str, Any] | None
) -> ScoreResult:
    """Score without blocking the event loop: async scorers awaited, sync ones in a worker thread."""
    info = dict(extra_info or {})
    try:
        if is_async_scorer(fn):
            value = await fn(response, ground_truth, extra_info=info)
        else:
            value = await asyncio.to_thread(fn, response, ground_truth, extra_info=info)
            if asyncio.iscoroutine(value):
                value = await value
        return to_result(value, scorer=name)
    except Exception as exc:
        return _failed(exc)
