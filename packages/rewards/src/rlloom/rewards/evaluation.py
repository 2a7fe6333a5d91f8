"""Score n sampled responses per problem and report avg@n, pass@k and maj@k per data source.

The engine-free half of a reasoning evaluation: the caller samples (any engine), this module scores every sample
with the registry's scorer for its row's `data_source` (in sandboxed worker processes, as training does), then
summarizes with `rlloom.rewards.at_k`. Voting for maj@k depends on the answer kind: math answers vote by the math
checker's equivalence ("1/2" and "0.5" agree), QA answers by their SQuAD-normalised text, and code is not voted
on (two programs are not "the same answer"), so code rows get avg@n and pass@k only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlloom.rewards.at_k import ProblemSamples, gold_votes_together, group_answers, summarize
from rlloom.rewards.batch import DEFAULT_TIMEOUT, score_batch
from rlloom.rewards.registry import DEFAULT_SCORERS, canonical_source

VOTE_TIMEOUT = 1.0
"""Seconds the math checker may spend deciding whether two sampled answers are the same (for maj@k)."""


class SampleRecord(BaseModel):
    """One scored sample: which problem and sample it is, and the scorer's verdict."""

    model_config = ConfigDict(extra="forbid")

    data_source: str
    problem: int = Field(description="Index of the problem's row in the rows given.")
    sample: int = Field(description="Which of the problem's n samples.")
    score: float
    correct: bool = Field(description="score >= the report's `correct_at` (1.0: every test / the exact answer).")
    extracted: str | None = Field(default=None, description="The answer the scorer read (None: none found).")
    error: str | None = None


class SourceReport(BaseModel):
    """The figures of one data source."""

    model_config = ConfigDict(extra="forbid")

    data_source: str
    problems: int
    samples_per_problem: int
    metrics: dict[str, float] = Field(description="avg@n, pass@k and (math, QA) maj@k, in [0, 1].")
    scoring_errors: int = Field(
        description="Samples whose scorer reported an error (a timeout, a crash, a sandbox violation); they score 0."
    )
    no_answer: int = Field(description="Samples from which no answer could be extracted.")


class EvalReport(BaseModel):
    """Per-source figures and every sample's verdict."""

    model_config = ConfigDict(extra="forbid")

    sources: list[SourceReport]
    records: list[SampleRecord]

    def table(self) -> str:
        """A markdown table: one row per data source, one column per metric (blank where a source lacks it)."""
        columns: list[str] = []
        for source in self.sources:
            columns += [name for name in source.metrics if name not in columns]
        lines = [
            "| data source | problems | " + " | ".join(columns) + " |",
            "|---|---|" + "---|" * len(columns),
        ]
        for source in self.sources:
            cells = [f"{100 * source.metrics[c]:.1f}" if c in source.metrics else "" for c in columns]
            lines.append(f"| {source.data_source} | {source.problems} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def evaluate_samples(
    rows: Sequence[Mapping[str, Any]],
    responses: Sequence[Sequence[str]],
    ks: Sequence[int],
    *,
    correct_at: float = 1.0,
    workers: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    progress: bool = False,
    seed: int = 0,
) -> EvalReport:
    """Score `responses[i]` (the n samples of `rows[i]`, a veRL-shaped row) and summarize per data source.

    Every row needs the same n within a data source; ks above n are refused (see `at_k.summarize`).
    """
    if len(rows) != len(responses):
        raise ValueError(f"{len(rows)} rows but {len(responses)} response lists; give one list of samples per row")
    items: list[dict[str, Any]] = []
    where: list[tuple[int, int]] = []
    for i, (row, samples) in enumerate(zip(rows, responses, strict=True)):
        source, truth, extra = _row_fields(row, i)
        for j, text in enumerate(samples):
            items.append({"response": text, "ground_truth": truth, "data_source": source, "extra_info": extra})
            where.append((i, j))
    results = score_batch(items, workers=workers, timeout=timeout, progress=progress)
    records = [
        SampleRecord(
            data_source=str(item["data_source"]),
            problem=i,
            sample=j,
            score=result.score,
            correct=result.score >= correct_at,
            extracted=result.extracted,
            error=result.error,
        )
        for item, (i, j), result in zip(items, where, results, strict=True)
    ]
    return EvalReport(sources=_summaries(records, ks, seed), records=records)


def _row_fields(row: Mapping[str, Any], index: int) -> tuple[str, Any, dict[str, Any]]:
    source = row.get("data_source")
    if not isinstance(source, str) or not source:
        raise ValueError(f"rows[{index}] has no 'data_source' (e.g. 'math500'); it picks the scorer")
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
        raise ValueError(
            f"rows[{index}] has no 'reward_model': {{'ground_truth': ...}}; prepare rows with prepare-data"
        )
    extra = row.get("extra_info") or {}
    if not isinstance(extra, Mapping):
        raise ValueError(f"rows[{index}]['extra_info'] must be an object, got {type(extra).__name__}")
    return source, reward_model["ground_truth"], dict(extra)


def _summaries(records: list[SampleRecord], ks: Sequence[int], seed: int) -> list[SourceReport]:
    by_source: dict[str, dict[int, list[SampleRecord]]] = {}
    for record in records:
        by_source.setdefault(record.data_source, {}).setdefault(record.problem, []).append(record)
    reports = []
    for source, problems in by_source.items():
        vote = voting_rule(source)
        samples = []
        for recs in problems.values():
            answers = [r.extracted for r in recs]
            correct = [r.correct for r in recs]
            labels: list[int | None] = [None] * len(recs)
            if vote is not None:
                labels = gold_votes_together(group_answers(answers, vote[1]), correct)
            samples.append(ProblemSamples([r.score for r in recs], correct, labels))
        flat = [r for recs in problems.values() for r in recs]
        reports.append(
            SourceReport(
                data_source=source,
                problems=len(problems),
                samples_per_problem=len(samples[0].scores),
                metrics=summarize(samples, ks, majority=vote is not None, seed=seed),
                scoring_errors=sum(r.error is not None for r in flat),
                no_answer=sum(r.extracted is None for r in flat),
            )
        )
    return reports


def voting_rule(data_source: str) -> tuple[str, Callable[[str, str], bool] | None] | None:
    """How this source's answers vote for maj@k: ("math", equivalence), ("qa", None after normalising), or None."""
    spec = DEFAULT_SCORERS.get(canonical_source(data_source) or "", "")
    if spec.startswith("rlloom.rewards.math:"):
        from rlloom.rewards.math import is_equivalent

        return "math", lambda a, b: is_equivalent(a, b, timeout=VOTE_TIMEOUT)
    if spec.startswith("rlloom.rewards.qa:"):
        from rlloom.rewards.qa import normalize_answer

        return "qa", lambda a, b: normalize_answer(a) == normalize_answer(b)
    return None
