"""Retrieve-then-rerank over any `Retriever`: Search-R1's `retrieval_rerank_server.py`, with a local cross-encoder.

`RerankingRetriever(base, RerankConfig(model=DIR))` asks `base` for `depth` candidates a query (Search-R1's
`--retrieval_topk`, 10), scores every (query, passage) pair with a sentence-transformers `CrossEncoder` loaded
from a local folder (nothing is downloaded), and returns the k best by that score, which becomes the hit's
`score`. The base can be an index, an online backend or a remote retrieval server (`client.RetrievalClient`).

Passages reach the cross-encoder as Search-R1's reranker writes them, `(Title: <first line>) <rest>`, so a
Search-R1 reranker checkpoint sees the text it was used with; `passage_format="contents"` sends `contents` as it is.
Unlike Search-R1's `rerank()`, which scores each query against every query's candidates of the batch (so a
query's list can hold other queries' passages), each query here is scored against its own candidates only.
torch and sentence-transformers are imported when a reranker is made (extra `dense`).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlloom.retrieval.types import Hit, Retriever

__all__ = [
    "CrossEncoderScorer",
    "RerankConfig",
    "RerankingRetriever",
    "document_contents",
    "passage_text",
    "rerank_documents",
]


class RerankConfig(BaseModel):
    """The cross-encoder and how many candidates it re-scores."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="Local sentence-transformers CrossEncoder folder (e.g. ms-marco-MiniLM-L12-v2).")
    depth: int = Field(default=10, gt=0, description="Candidates a query from the base retriever (Search-R1: 10).")
    batch_size: int = Field(default=32, gt=0, description="Pairs per cross-encoder forward pass (Search-R1: 32).")
    max_length: int = Field(default=512, gt=0, description="Tokens per (query, passage) pair (Search-R1: 512).")
    device: str | None = Field(default=None, description="torch device; None picks CUDA when present.")
    passage_format: Literal["search-r1", "contents"] = Field(
        default="search-r1", description="'search-r1': '(Title: <first line>) <rest>'; 'contents': as stored."
    )

    @field_validator("model")
    @classmethod
    def _local(cls, value: str) -> str:
        from rlloom.retrieval.dense import local_model_folder  # dense.py imports no torch at module level

        return local_model_folder(value)


def passage_text(hit: Hit, passage_format: str = "search-r1") -> str:
    """The text the cross-encoder reads for a hit (Search-R1's `_passage_to_string` by default)."""
    return contents_text(hit.contents, passage_format)


def contents_text(contents: str, passage_format: str = "search-r1") -> str:
    """`contents` (title on the first line) as the cross-encoder reads it: '(Title: <first line>) <rest>'."""
    if passage_format == "contents":
        return contents
    title, _, text = contents.partition("\n")
    return f"(Title: {title}) {text}"


def document_contents(item: Any) -> str:
    """A document item's `contents`, as Search-R1's rerank server reads it: `item["contents"]`, or
    `item["document"]["contents"]` (the retrieval server's `return_scores` form); ValueError otherwise."""
    if isinstance(item, dict):
        inner = item.get("document", item)
        if isinstance(inner, dict) and isinstance(inner.get("contents"), str):
            return str(inner["contents"])
    raise ValueError('expected {"contents": "..."} or {"document": {"contents": "..."}}')


def rerank_documents(
    scorer: Any, queries: list[str], documents: list[list[str]], k: int, passage_format: str = "search-r1"
) -> list[list[tuple[str, float]]]:
    """Search-R1's `/rerank`: each query's own documents (`contents` strings) scored by the cross-encoder, the k
    best first, as (the passage text it read, score). Search-R1 scores each query against every query's documents
    of the request; here a query's list holds its own documents only (as `RerankingRetriever`)."""
    texts = [[contents_text(c, passage_format) for c in docs] for docs in documents]
    scores = scorer.score([(q, t) for q, docs in zip(queries, texts, strict=True) for t in docs]).tolist()
    out, at = [], 0
    for docs in texts:
        mine = scores[at : at + len(docs)]
        at += len(docs)
        order = sorted(range(len(docs)), key=lambda i: -mine[i])[:k]  # stable: ties keep the order sent
        out.append([(docs[i], float(mine[i])) for i in order])
    return out


class CrossEncoderScorer:
    """A sentence-transformers CrossEncoder from a local folder; `score(pairs)` is its `predict` (one logit, with
    the model's default activation, as Search-R1 calls it; for several classes, the last)."""

    def __init__(self, config: RerankConfig) -> None:
        try:
            from sentence_transformers import CrossEncoder
        except ImportError:
            raise ImportError(
                "reranking needs the `dense` extra (sentence-transformers): pip install 'rlloom-retrieval[dense]'"
            ) from None
        self.config = config
        self.model = CrossEncoder(config.model, device=config.device, max_length=config.max_length)

    def score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        raw = self.model.predict(pairs, batch_size=self.config.batch_size, show_progress_bar=False)
        scores = np.asarray(raw, dtype=np.float32)
        return scores.reshape(len(pairs), -1)[:, -1]


class RerankingRetriever:
    """`base`'s top `depth` candidates, re-scored by a cross-encoder; implements `Retriever`."""

    def __init__(self, base: Retriever, config: RerankConfig, scorer: Any | None = None) -> None:
        self.base, self.config = base, config
        self.scorer = scorer if scorer is not None else CrossEncoderScorer(config)

    def search(self, queries: list[str], k: int, depth: int | None = None) -> list[list[Hit]]:
        """The k best of each query's `depth` (default `config.depth`, at least k) candidates by the cross-encoder."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        candidates = self.base.search(queries, max(k, depth or self.config.depth))
        form = self.config.passage_format
        pairs = [(q, passage_text(h, form)) for q, hits in zip(queries, candidates, strict=True) for h in hits]
        scores = self.scorer.score(pairs).tolist()
        out, at = [], 0
        for hits in candidates:
            mine = scores[at : at + len(hits)]
            at += len(hits)
            order = sorted(range(len(hits)), key=lambda i: -mine[i])[:k]  # stable: ties keep the base's order
            out.append([hits[i].model_copy(update={"score": float(mine[i])}) for i in order])
        return out

    def over_window(self, queries: list[str]) -> dict[int, str]:
        """The base's query-window report (a dense base's encoder window)."""
        check = getattr(self.base, "over_window", None)
        return check(queries) if check is not None else {}
