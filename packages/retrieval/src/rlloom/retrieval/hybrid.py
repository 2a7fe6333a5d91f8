"""Fusion of two rankings (reciprocal-rank or weighted min-max scores) and an optional cross-encoder re-ranker.

The fusion functions are pure: rankings in, ranking out, so they are tested against hand-computed fusions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlloom.retrieval.ranking import Ranking, RankingBackend


class PartSpec(BaseModel):
    """One side of a hybrid: a backend name and its build options (e.g. `{"backend": "bm25", "k1": 0.9}`)."""

    model_config = ConfigDict(extra="allow")

    backend: Literal["bm25", "dense", "lucene"]

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class HybridConfig(BaseModel):
    """How two backends are combined."""

    model_config = ConfigDict(extra="forbid")
    # fusion and re-ranking happen per query; only the parts themselves are built
    QUERY_TIME: ClassVar[frozenset[str]] = frozenset(
        {"fusion", "rrf_k", "weights", "depth", "rerank_model", "rerank_depth"}
    )

    first: PartSpec = Field(description="First backend (typically bm25).")
    second: PartSpec = Field(description="Second backend (typically dense).")
    fusion: Literal["rrf", "weighted"] = Field(default="rrf", description="Reciprocal-rank or weighted min-max fusion.")
    rrf_k: float = Field(default=60.0, gt=0, description="RRF constant: score = sum 1/(rrf_k + rank).")
    weights: tuple[float, float] = Field(default=(0.5, 0.5), description="Weight of first and second in either fusion.")
    depth: int = Field(default=100, gt=0, description="Candidates taken from each part before fusing.")
    rerank_model: str | None = Field(default=None, description="Local cross-encoder folder; re-scores the fused top.")
    rerank_depth: int = Field(default=20, gt=0, description="Fused candidates the cross-encoder re-scores.")

    @field_validator("rerank_model")
    @classmethod
    def _local_model(cls, value: str | None) -> str | None:
        from rlloom.retrieval.dense import local_model_folder  # dense.py imports no torch at module level

        return None if value is None else local_model_folder(value)

    @model_validator(mode="after")
    def _weights_valid(self) -> HybridConfig:
        if min(self.weights) < 0 or sum(self.weights) <= 0:
            raise ValueError(f"weights {self.weights} must be non-negative with a positive sum")
        return self


def reciprocal_rank_fusion(rankings: Sequence[Ranking], weights: Sequence[float], rrf_k: float, k: int) -> Ranking:
    """score(d) = sum_i w_i / (rrf_k + rank_i(d)), ranks from 1; ties keep the order of first appearance."""
    fused: dict[int, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for rank, row in enumerate(ranking.rows.tolist(), start=1):
            fused[row] = fused.get(row, 0.0) + weight / (rrf_k + rank)
    return _top(fused, k)


def weighted_score_fusion(rankings: Sequence[Ranking], weights: Sequence[float], k: int) -> Ranking:
    """score(d) = sum_i w_i * minmax_i(d) over each ranking's own scores; a passage absent from a ranking gets 0."""
    fused: dict[int, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        if len(ranking.rows) == 0:
            continue
        lo, hi = float(ranking.scores.min()), float(ranking.scores.max())
        span = hi - lo
        for row, score in zip(ranking.rows.tolist(), ranking.scores.tolist(), strict=True):
            normed = (score - lo) / span if span > 0 else 1.0
            fused[row] = fused.get(row, 0.0) + weight * normed
    return _top(fused, k)


def _top(fused: dict[int, float], k: int) -> Ranking:
    items = sorted(fused.items(), key=lambda kv: -kv[1])[:k]  # sorted() is stable: ties keep insertion order
    return Ranking(
        np.asarray([r for r, _ in items], dtype=np.int64), np.asarray([s for _, s in items], dtype=np.float32)
    )


class CrossEncoderReranker:
    """Re-scores (query, passage) pairs with a sentence-transformers CrossEncoder; needs the `dense` extra."""

    def __init__(self, model: str, device: str | None = None) -> None:
        from sentence_transformers import CrossEncoder

        self.model = CrossEncoder(model, device=device)

    def rerank(self, query: str, ranking: Ranking, passages: list[str], k: int) -> Ranking:
        if len(ranking.rows) == 0:
            return ranking
        scores = np.asarray(self.model.predict([(query, p) for p in passages], show_progress_bar=False))
        scores = scores.reshape(len(passages), -1)[:, -1].astype(np.float32)  # one logit, or the last class
        order = np.argsort(-scores, kind="stable")[:k]
        return Ranking(ranking.rows[order], scores[order])


class HybridBackend:
    """Two backends over one passage store, fused; `passages` fetches texts for the re-ranker."""

    def __init__(
        self,
        first: RankingBackend,
        second: RankingBackend,
        config: HybridConfig,
        passages: Callable[[list[int]], list[str]],
    ) -> None:
        if first.doc_count != second.doc_count:
            raise ValueError(f"hybrid parts index different corpora ({first.doc_count} vs {second.doc_count} docs)")
        self.first, self.second, self.config = first, second, config
        self.doc_count = first.doc_count
        self._passages = passages
        self.reranker = CrossEncoderReranker(config.rerank_model) if config.rerank_model else None

    def over_window(self, queries: list[str]) -> dict[int, str]:
        """Queries a dense part's encoder cuts to its window (see `DenseBackend.over_window`)."""
        out: dict[int, str] = {}
        for part in (self.second, self.first):
            check = getattr(part, "over_window", None)
            if check is not None:
                out.update(check(queries))
        return out

    def rank(self, queries: list[str], k: int) -> list[Ranking]:
        depth = max(k, self.config.depth)
        pairs = zip(self.first.rank(queries, depth), self.second.rank(queries, depth), strict=True)
        fused_depth = max(k, self.config.rerank_depth) if self.reranker else k
        if self.config.fusion == "rrf":
            fused = [reciprocal_rank_fusion(p, self.config.weights, self.config.rrf_k, fused_depth) for p in pairs]
        else:
            fused = [weighted_score_fusion(p, self.config.weights, fused_depth) for p in pairs]
        if self.reranker is None:
            return fused
        return [
            self.reranker.rerank(q, f, self._passages(f.rows.tolist()), k) for q, f in zip(queries, fused, strict=True)
        ]
