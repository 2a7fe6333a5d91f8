"""The server's request and response bodies, as pydantic models: what /retrieve and /search parse, and what
/docs (OpenAPI) shows for every answer, the 422/413/408/503/500 errors included.

`/retrieve` reads its body the way Search-R1's own server does (PeterGriffinJin/Search-R1,
`search_r1/search/retrieval_server.py`: a plain pydantic model), so any client written against that server works
here: unknown fields are ignored, `topk` "3" or 3.0 is 3, and `topk` 0 or null means the server's default.
`/search` is rlloom's own route and stays strict: an unknown field or a non-integer `k` is a 422 naming it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class RetrieveRequest(BaseModel):
    """Search-R1's request body (its trainer sends exactly `queries`, `topk` and `return_scores`)."""

    model_config = ConfigDict(extra="ignore")  # as Search-R1's server: a field it does not know is ignored

    queries: list[str] = Field(description="The queries; an empty list answers an empty `result`.")
    topk: int | None = Field(default=None, description="Passages per query; 0 or null: the server's default (3).")
    return_scores: bool = Field(default=False, description="Wrap each passage as {document, score}.")


class RerankRetrieveRequest(RetrieveRequest):
    """/retrieve on a reranking server: Search-R1's `retrieval_rerank_server.py` body, which adds two fields.

    `topk_rerank` (else `topk`, else the default 3) passages a query are returned, the best of `topk_retrieval`
    (else the server's `--rerank-opt depth`, 10) candidates by the cross-encoder. Search-R1's trainer sends
    `topk`; its rerank server ignores that and returns `topk_rerank`, 3 by default: the same passages here.
    """

    topk_retrieval: int | None = Field(default=None, description="Candidates a query; null: the server's depth.")
    topk_rerank: int | None = Field(default=None, description="Passages a query after reranking; null: `topk`.")


class RerankRequest(BaseModel):
    """/rerank: Search-R1's `rerank_server.py` body: each query's candidate documents, as the retrieval server
    returns them (`{"id", "contents"}` or `{"document": {...}, "score"}` items)."""

    model_config = ConfigDict(extra="ignore")  # as Search-R1's server

    queries: list[str] = Field(description="The queries.")
    documents: list[list[dict[str, Any]]] = Field(description="One list of candidate documents per query.")
    rerank_topk: int | None = Field(default=None, description="Documents a query returned; 0 or null: the default 3.")
    return_scores: bool = Field(default=False, description="Wrap each passage as {document, score}.")


class SearchRequest(BaseModel):
    """The native request body."""

    model_config = ConfigDict(extra="forbid", strict=True)

    queries: list[str] = Field(description="The queries; an empty list answers an empty `results`.")
    k: int = Field(default=10, description="Passages per query.")


RENAMED: dict[type[BaseModel], dict[str, str]] = {SearchRequest: {"topk": "k"}}
"""The other route's name for a field, so a mixed-up /search request is told which name this route uses."""


class SearchR1Document(BaseModel):
    """A passage as Search-R1 returns it: `contents` is the title in quotes on the first line, then the text."""

    id: str
    contents: str


class ScoredDocument(BaseModel):
    document: SearchR1Document
    score: float


class TruncatedQuery(BaseModel):
    """A query that was cut to fit: by the server's `max_query_chars`, or by a dense encoder's token window."""

    index: int = Field(description="Its position in `queries`.")
    chars: int = Field(description="Its length in characters as sent.")
    limit: str = Field(description='What it was cut to: "4096 characters" or "256 tokens (the encoder\'s window)".')


class RetrieveResponse(BaseModel):
    """One list per query, best first: `{document, score}` items with `return_scores`, bare documents without."""

    result: list[list[ScoredDocument]] | list[list[SearchR1Document]]
    truncated_queries: list[TruncatedQuery] | None = Field(
        default=None, description="Only when a query was cut to fit; Search-R1's client reads `result` alone."
    )


class ScoredPassage(BaseModel):
    document: str = Field(description="The passage as the cross-encoder read it: '(Title: <first line>) <rest>'.")
    score: float


class RerankResponse(BaseModel):
    """Search-R1's /rerank answer: one list per query, best first by the cross-encoder."""

    result: list[list[ScoredPassage]] | list[list[str]]


class NativeHit(BaseModel):
    doc_id: str
    score: float
    text: str
    title: str | None


class SearchResponse(BaseModel):
    results: list[list[NativeHit]]
    truncated_queries: list[TruncatedQuery] | None = Field(default=None, description="Only when a query was cut.")


class ErrorLocation(BaseModel):
    loc: list[str | int] = Field(description='Where the problem is, e.g. ["body", "queries", 3].')
    msg: str = Field(description="What is wrong and how to fix it.")
    type: str = Field(description="The kind of error (pydantic's error type, or value_error for a limit).")


class ValidationErrorBody(BaseModel):
    """422: FastAPI's validation-error shape, for schema errors and limit errors alike."""

    detail: list[ErrorLocation]


class MessageErrorBody(BaseModel):
    """413, 408, 503 and 500: one sentence saying what happened and what to do."""

    detail: str


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    408: {"model": MessageErrorBody, "description": "The body did not arrive within body_timeout_s; the connection "
          "is closed."},
    413: {"model": MessageErrorBody, "description": "The body is larger than max_body_bytes, or the answer would "
          "pass max_response_bytes; the detail names the limit and the flag that raises it."},
    422: {"model": ValidationErrorBody, "description": "Not valid JSON, not the schema, or over a limit (max_queries, "
          "max_topk); `loc` names the field. An over-long query is cut and reported, not refused."},
    500: {"model": MessageErrorBody, "description": "The retriever failed on this batch."},
    503: {"model": MessageErrorBody, "description": "The queue is full (max_pending_queries): retry after "
          "Retry-After seconds. At max_connections uvicorn answers a plain-text 503 and closes the connection."},
}  # fmt: skip


def route_docs(request: type[BaseModel], response: type[BaseModel]) -> dict[str, Any]:
    """FastAPI route arguments documenting a route that parses its own body: request schema and every answer."""
    body = {"requestBody": {"required": True, "content": {"application/json": {"schema": request.model_json_schema()}}}}
    return {"openapi_extra": body, "responses": {200: {"model": response}, **ERROR_RESPONSES}}
