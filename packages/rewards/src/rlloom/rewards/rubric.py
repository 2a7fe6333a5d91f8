"""Weighted composition of scorers, reporting every component (verifiers' Rubric, without name injection).

A `Rubric` is itself a `Scorer`, so it can sit in the registry, in a batch or inside another rubric. Weight 0
makes a component a logged metric that does not move the reward. A component that raises, or returns NaN or
infinity, scores 0 and its error is reported; the others still count, so one broken check never hides the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlloom.rewards.registry import get_scorer, is_async_scorer, to_result
from rlloom.rewards.types import ScoreResult


class RubricTerm(BaseModel):
    """One weighted part of a rubric: a scorer (callable or registry name / import spec) and its weight."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    name: str = Field(description="Component name in the result's `components` (e.g. 'accuracy', 'format').")
    scorer: Callable[..., Any] | str = Field(description="A Scorer, a data_source name or 'module:function'.")
    weight: float = Field(
        default=1.0, allow_inf_nan=False, description="Multiplier in the weighted sum (finite); 0 = report only."
    )


def _as_term(term: Any, index: int) -> RubricTerm:
    if isinstance(term, RubricTerm):
        return term
    if isinstance(term, tuple | list) and len(term) == 3:
        return RubricTerm(name=term[0], scorer=term[1], weight=term[2])
    shape = (
        f"a {type(term).__name__} of {len(term)} element(s)"
        if isinstance(term, tuple | list)
        else "a " + (type(term).__name__)
    )
    raise ValueError(
        f"rubric term {index} is {shape} ({term!r:.100}); give each term as (name, scorer, weight), e.g. "
        "('accuracy', 'gsm8k', 1.0), or a RubricTerm"
    )


class Rubric:
    """score = sum(weight_i * score_i) over its terms; `components` holds every raw score_i by name."""

    def __init__(self, terms: Sequence[RubricTerm | tuple[str, Callable[..., Any] | str, float]]) -> None:
        parsed = [_as_term(t, i) for i, t in enumerate(terms)]
        if not parsed:
            raise ValueError("a Rubric needs at least one term")
        names = [t.name for t in parsed]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"rubric term names must be unique; repeated: {dupes}")
        self.terms = parsed
        self._fns = [get_scorer(t.scorer) if isinstance(t.scorer, str) else t.scorer for t in parsed]
        self._names = [t.scorer if isinstance(t.scorer, str) else getattr(t.scorer, "__name__", None) for t in parsed]

    def _combine(self, results: list[ScoreResult | BaseException]) -> ScoreResult:
        components: dict[str, float] = {}
        details: dict[str, Any] = {}
        errors = []
        total = 0.0
        extracted = None
        for term, res in zip(self.terms, results, strict=True):
            if isinstance(res, BaseException):
                res = ScoreResult(score=0.0, error=f"{type(res).__name__}: {res}")
            components[term.name] = res.score
            for sub, value in res.components.items():
                components[f"{term.name}/{sub}"] = value
            if res.error:
                errors.append(f"{term.name}: {res.error}")
            if res.details:
                details[term.name] = res.details
            extracted = extracted if extracted is not None else res.extracted
            total += term.weight * res.score
        return ScoreResult(
            score=total, components=components, extracted=extracted, error="; ".join(errors) or None, details=details
        )

    def __call__(self, response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
        """Score synchronously; async terms are run to completion on a private event loop."""
        results: list[ScoreResult | BaseException] = []
        for fn, name in zip(self._fns, self._names, strict=True):
            try:
                value = fn(response, ground_truth, extra_info=extra_info)
                if asyncio.iscoroutine(value):
                    value = asyncio.run(value)
                results.append(to_result(value, scorer=name))
            except Exception as exc:  # a broken term scores 0 and is reported, never sinks the rubric
                results.append(exc)
        return self._combine(results)

    async def ascore(
        self, response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None
    ) -> ScoreResult:
        """Score with async terms (judges) awaited concurrently and sync terms run in threads."""

        async def one(fn: Callable[..., Any], name: str | None) -> ScoreResult:
            if is_async_scorer(fn):
                return to_result(await fn(response, ground_truth, extra_info=extra_info), scorer=name)
            return to_result(await asyncio.to_thread(fn, response, ground_truth, extra_info=extra_info), scorer=name)

        jobs = (one(fn, name) for fn, name in zip(self._fns, self._names, strict=True))
        gathered = await asyncio.gather(*jobs, return_exceptions=True)
        return self._combine(list(gathered))
