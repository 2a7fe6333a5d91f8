"""The one shape every scorer shares, so rubrics, the registry and batch scoring can combine any of them.

A scorer is a plain callable `(response, ground_truth, *, extra_info=None) -> float | ScoreResult`. Returning a
bare float is fine for simple rules; a `ScoreResult` carries the components and the reason, which training
logs per component.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field


class ScoreResult(BaseModel):
    """A scorer's verdict on one response: the score plus everything needed to explain it."""

    model_config = ConfigDict(extra="forbid")

    score: float = Field(description="The reward: 1.0/0.0 for rule checks, any float for shaped rewards.")
    components: dict[str, float] = Field(default_factory=dict, description="Named parts of the score.")
    extracted: str | None = Field(default=None, description="The answer the scorer read from the response.")
    error: str | None = Field(default=None, description="Why scoring failed (the score is then 0), else None.")
    details: dict[str, Any] = Field(default_factory=dict, description="Scorer-specific diagnostics.")


class Scorer(Protocol):
    """Anything that scores one response against its ground truth."""

    def __call__(
        self, response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None
    ) -> float | ScoreResult: ...


def as_result(value: float | ScoreResult) -> ScoreResult:
    """Normalise a scorer's return value to a `ScoreResult`."""
    return value if isinstance(value, ScoreResult) else ScoreResult(score=float(value))
