"""Offline difficulty filtering: keep the training rows the starting model solves sometimes.

GRPO learns only from groups whose rewards differ; a prompt the model never solves (or always solves) gives every
sample the same reward, so zero advantage and no gradient. Skywork-OR1 (He et al. 2025, arXiv 2505.22312, "model-
aware difficulty estimation") samples the starting model several times per problem before training and drops the
problems with pass rate 0 or 1. This module turns an evaluation's scored samples into each row's pass rate and
selects the rows inside a band; sampling and scoring stay `eval_runner`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlloom.rewards.evaluation import SampleRecord


class PassBand(BaseModel):
    """Rows whose pass rate lies strictly between `low` and `high` are kept (Skywork-OR1: (0, 1))."""

    model_config = ConfigDict(extra="forbid")

    low: float = Field(default=0.0, ge=0.0, le=1.0, description="keep rows solved more often than this")
    high: float = Field(default=1.0, ge=0.0, le=1.0, description="keep rows solved less often than this")

    @model_validator(mode="after")
    def _ordered(self) -> PassBand:
        if not self.low < self.high:
            raise ValueError(f"low {self.low:g} is not below high {self.high:g}: no pass rate fits; e.g. (0, 1)")
        return self

    def keeps(self, rate: float) -> bool:
        return self.low < rate < self.high


class Selection(BaseModel):
    """The rows kept (each with `extra_info.pass_rate`), and how the pass rates fell."""

    kept: list[dict[str, Any]]
    rates: list[float] = Field(description="every row's pass rate, in the order the rows were given")
    samples_per_row: int
    never_solved: int
    always_solved: int

    def summary(self, band: PassBand) -> str:
        total = len(self.rates)
        return (
            f"kept {len(self.kept)} of {total} rows (pass rate in ({band.low:g}, {band.high:g}) over "
            f"{self.samples_per_row} samples each); {self.never_solved} never solved, {self.always_solved} always "
            f"solved, mean pass rate {sum(self.rates) / max(total, 1):.3f}"
        )


def pass_rates(records: Sequence[SampleRecord], rows: int) -> tuple[list[float], int]:
    """Each row's share of correct samples, and the samples per row (every row must have the same number)."""
    correct: list[list[bool]] = [[] for _ in range(rows)]
    for record in records:
        if not 0 <= record.problem < rows:
            raise ValueError(f"a scored sample names problem {record.problem}, but only {rows} rows were given")
        correct[record.problem].append(record.correct)
    counts = {len(c) for c in correct}
    if counts == {0}:
        raise ValueError("no scored samples: sample each row at least once (--n 1 or more)")
    if len(counts) != 1:
        missing = [i for i, c in enumerate(correct) if len(c) != max(counts)]
        raise ValueError(
            f"rows {missing[:5]} have fewer samples than the others ({sorted(counts)}); every row needs --n samples"
        )
    return [sum(c) / len(c) for c in correct], counts.pop()


def select_by_pass_rate(
    rows: Sequence[Mapping[str, Any]], records: Sequence[SampleRecord], band: PassBand
) -> Selection:
    """The rows whose pass rate lies inside `band`, in their original order, each marked with its pass rate."""
    rates, per_row = pass_rates(records, len(rows))
    kept = []
    for row, rate in zip(rows, rates, strict=True):
        if band.keeps(rate):
            extra = dict(row.get("extra_info") or {})
            extra["pass_rate"] = rate
            kept.append({**row, "extra_info": extra})
    return Selection(
        kept=kept,
        rates=rates,
        samples_per_row=per_row,
        never_solved=sum(rate == 0.0 for rate in rates),
        always_solved=sum(rate == 1.0 for rate in rates),
    )


__all__ = ["PassBand", "Selection", "pass_rates", "select_by_pass_rate"]
