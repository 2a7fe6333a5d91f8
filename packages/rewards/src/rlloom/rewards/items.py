"""One unit of batch scoring, `ScoreItem`, and how to score it in the current process.

Shared by the pool's parent (which validates items) and its workers (which score them), and by
`score_batch(workers=0)`. Failures are results, not exceptions: `error_result` tags them with an `error_kind`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlloom.rewards.registry import ScorerLoadError, get_scorer, scorer_spec, to_result
from rlloom.rewards.types import ScoreResult

ErrorKind = Literal["timeout", "crash", "memory", "exception", "load"]


class ScoreItem(BaseModel):
    """One response to score: what to score it against and which scorer (a data_source name or import spec)."""

    model_config = ConfigDict(extra="forbid")

    response: str = Field(description="The model's output text (bytes are decoded as UTF-8 with replacement).")
    ground_truth: Any = Field(default=None, description="What the scorer compares against (its own format).")
    data_source: str | None = Field(default=None, description="Dataset name routed via the registry, e.g. 'gsm8k'.")
    scorer: str | None = Field(
        default=None, description="'module:function' or 'file.py:function'; overrides data_source when both given."
    )
    extra_info: dict[str, Any] = Field(default_factory=dict, description="Passed to the scorer as extra_info.")

    @field_validator("response", mode="before")
    @classmethod
    def _decode(cls, value: Any) -> Any:
        return value.decode("utf-8", errors="replace") if isinstance(value, bytes | bytearray) else value

    @model_validator(mode="after")
    def _has_scorer(self) -> ScoreItem:
        if self.scorer is None and self.data_source is None:
            raise ValueError("give a data_source (e.g. 'gsm8k') or a scorer ('module:function') for every item")
        return self

    def spec(self) -> str:
        """The import spec of this item's scorer."""
        return scorer_spec(self.scorer or self.data_source or "")


def as_item(
    value: ScoreItem | Mapping[str, Any] | Sequence[Any], index: int, default_scorer: str | None = None
) -> ScoreItem:
    """Accept a ScoreItem, a dict of its fields, or a tuple (response, ground_truth, data_source_or_scorer,
    extra_info?); a third element with a ':' is a scorer spec, otherwise a data_source."""
    try:
        if isinstance(value, ScoreItem):
            return value
        if isinstance(value, Mapping):
            data = dict(value)
            if default_scorer and not data.get("scorer") and not data.get("data_source"):
                data["scorer"] = default_scorer
            return ScoreItem.model_validate(data)
        if isinstance(value, Sequence) and not isinstance(value, str | bytes):
            if not 2 <= len(value) <= 4:
                raise TypeError(
                    f"items[{index}] is a {type(value).__name__} of {len(value)} element(s); a tuple item is "
                    "(response, ground_truth[, data_source_or_scorer[, extra_info]]): 2 to 4 elements"
                )
            response, ground_truth, *rest = value
            name = rest[0] if rest else default_scorer
            key = "scorer" if isinstance(name, str) and ":" in name else "data_source"
            extra = rest[1] if len(rest) > 1 and rest[1] is not None else {}
            return ScoreItem.model_validate(
                {"response": response, "ground_truth": ground_truth, key: name, "extra_info": extra}
            )
    except ValueError as exc:
        raise ValueError(f"items[{index}] is invalid: {exc}") from exc
    raise TypeError(
        f"items[{index}] is a {type(value).__name__}; give a ScoreItem, a dict, or a tuple "
        "(response, ground_truth, data_source_or_scorer, extra_info)"
    )


def error_result(kind: ErrorKind, message: str) -> ScoreResult:
    """A zero score that says why, with `details["error_kind"]` for counting failures by kind."""
    return ScoreResult(score=0.0, error=message, details={"error_kind": kind})


def score_item(item: ScoreItem) -> ScoreResult:
    """Score one item in this process (no timeout, no isolation): what each worker runs per item."""
    try:
        fn = get_scorer(item.spec())
    except ScorerLoadError as exc:
        return error_result("load", str(exc))
    value = fn(item.response, item.ground_truth, extra_info=item.extra_info)
    if asyncio.iscoroutine(value):
        value = asyncio.run(value)
    return to_result(value, scorer=item.spec())
