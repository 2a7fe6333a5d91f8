"""The retrieval HTTP server: Search-R1's `POST /retrieve`, the native `POST /search`, `/health` and `/stats`, and
with a cross-encoder Search-R1's `POST /rerank` (its `rerank_server.py`: queries and their candidate documents in,
each query's documents reordered out), also on its own with no index (`serve --rerank-model DIR` alone).

Requests from all clients go through one `MicroBatcher`, so 32 agents asking one query each cost about one
backend call, not 32. Sized for Search-R1's trainer, which sends every search of a turn in one request (512
prompts x 5 samples = 2,560 queries): up to `max_queries` (8,192) queries a request, searched in pieces of
`max_batch_queries` and written out piece by piece, so what one request holds is bounded by `max_response_bytes`
(413 naming the limit beyond it). An over-long query is cut to `max_query_chars`, or found to pass a dense
encoder's token window, and reported in the answer's `truncated_queries` and a log line, never a 422 for the
batch. Other limits (queries per request, topk) answer 422 naming the field; a full queue answers 503 at once;
any backend error answers 500 for that request only. A body that stalls gets 408 and its connection closed; idle
connections are closed and open ones capped (`uvicorn_options`), so slow or stuck clients cannot use up the
process's file descriptors.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import to_json

from rlloom.retrieval.batching import MicroBatcher, OverloadedError
from rlloom.retrieval.connections import GuardedHttpToolsProtocol, default_max_connections
from rlloom.retrieval.fast_path import QueryFastPath
from rlloom.retrieval.types import Hit, Retriever
from rlloom.retrieval.wire import (
    RENAMED,
    RerankRequest,
    RerankResponse,
    RerankRetrieveRequest,
    RetrieveRequest,
    RetrieveResponse,
    SearchRequest,
    SearchResponse,
    route_docs,
)

__all__ = ["RetrieveRequest", "SearchRequest", "ServerLimits", "create_app", "uvicorn_options"]

logger = logging.getLogger("rlloom.retrieval.server")

DEFAULT_BODY_BYTES = 64 * 1024 * 1024


class ServerLimits(BaseModel):
    """Request limits and batching knobs (all per worker process)."""

    model_config = ConfigDict(extra="forbid")

    max_queries: int = Field(
        default=8192,
        gt=0,
        description="Queries per request (Search-R1's trainer sends a whole turn at once: 512 prompts x 5 = 2,560).",
    )
    max_topk: int = Field(default=100, gt=0, description="Largest topk/k a request may ask for.")
    max_query_chars: int = Field(
        default=4096,
        gt=0,
        description="Characters a query is cut to (and reported in `truncated_queries`); a dense encoder also "
        "cuts to its token window, which is reported the same way.",
    )
    default_topk: int = Field(
        default=3, gt=0, description="topk when a /retrieve request sends null (Search-R1 uses 3)."
    )
    max_body_bytes: int | None = Field(
        default=None,
        gt=0,
        description="Largest request body; a larger one gets 413 without being read whole. Default: 64 MiB "
        "(2,560 queries of 4,096 characters fit 6 times over).",
    )
    max_response_bytes: int = Field(
        default=256 * 1024 * 1024,
        gt=0,
        description="Largest answer one request may build (about queries x topk x passage bytes); past it the "
        "request gets 413 naming this limit. Bounds the memory a request holds.",
    )
    batch_window_ms: float = Field(default=1.0, ge=0, description="How long the batcher waits to gather more queries.")
    max_batch_queries: int = Field(default=1024, gt=0, description="Queries per backend call.")
    max_pending_queries: int = Field(default=8192, gt=0, description="Queued queries beyond which requests get 503.")
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a request body may take to arrive in full; a slower one gets 408 and its connection "
        "is closed.",
    )
    idle_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds a connection may wait for a complete request head, after opening or after its last "
        "response, before it is closed (uvicorn's timeout_keep_alive, also applied before the first request).",
    )
    max_connections: int | None = Field(
        default=None,
        gt=1,
        description="Open connections (and requests in flight) beyond which new requests get 503 and are closed; "
        "default: half the process's open-file limit.",
    )
    freeze_gc: bool = Field(
        default=True,
        description="Exempt objects alive at startup from full GC passes (tens-of-ms stalls under load); turn off "
        "when embedding the app in a process whose startup objects must stay collectable.",
    )

    def body_limit(self) -> int:
        """`max_body_bytes`, or 64 MiB."""
        return self.max_body_bytes or DEFAULT_BODY_BYTES

    def connection_limit(self) -> int:
        """`max_connections`, or half the open-file limit of this process."""
        return self.max_connections or default_max_connections()


def uvicorn_options(limits: ServerLimits) -> dict[str, Any]:
    """The uvicorn settings that enforce `limits` on connections: pass them to `uvicorn.run` or `uvicorn.Config`."""
    return {
        "http": GuardedHttpToolsProtocol,
        "timeout_keep_alive": limits.idle_timeout_s,  # uvicorn annotates int; call_later takes any float
        "limit_concurrency": limits.connection_limit(),
    }


class LatencyWindow:
    """The last `size` request latencies, for percentiles in /stats."""

    def __init__(self, size: int = 10_000) -> None:
        self._values: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._values.append(seconds)

    def percentiles_ms(self) -> dict[str, float | None]:
        if not self._values:
            return {"p50": None, "p90": None, "p99": None, "max": None}
        arr = np.asarray(self._values) * 1000
        p50, p90, p99 = np.percentile(arr, [50, 90, 99])
        return {
            "p50": round(float(p50), 3),
            "p90": round(float(p90), 3),
            "p99": round(float(p99), 3),
            "max": round(float(arr.max()), 3),
        }


def _invalid(loc: tuple[str | int, ...], message: str) -> Response:
    """422 in FastAPI's own validation-error shape, so clients parse limit errors and schema errors alike."""
    return _json({"detail": [{"loc": ["body", *loc], "msg": message, "type": "value_error"}]}, 422)


def _check(queries: list[str], k: int, k_field: str, limits: ServerLimits) -> Response | None:
    if len(queries) > limits.max_queries:
        return _invalid(
            ("queries",),
            f"{len(queries)} queries exceed the limit of {limits.max_queries} per request; send fewer, or start the "
            f"server with `--limit max_queries={len(queries)}`",
        )
    if k < 1 or k > limits.max_topk:
        return _invalid((k_field,), f"must be between 1 and {limits.max_topk}, got {k}")
    return None


class _Answer:
    """One query's hits, and the token window its text passed (None when it fit)."""

    __slots__ = ("hits", "window")

    def __init__(self, hits: list[Hit], window: str | None) -> None:
        self.hits, self.window = hits, window


def _trim(answer: _Answer, k: int) -> _Answer:
    return _Answer(answer.hits[:k], answer.window)


def _truncate(queries: list[str], max_chars: int) -> tuple[list[str], dict[int, str]]:
    """Queries cut to `max_chars` characters, and which were cut."""
    cut = {i: f"{max_chars} characters" for i, q in enumerate(queries) if len(q) > max_chars}
    if not cut:
        return queries, cut
    return [q[:max_chars] if i in cut else q for i, q in enumerate(queries)], cut


def _schema_error(err: ValidationError, model: type[BaseModel]) -> Response:
    """A body that is not valid JSON or does not fit the schema: 422 in FastAPI's shape, locations under `body`."""
    detail = []
    for e in err.errors(include_url=False, include_context=False, include_input=False):
        msg = e.get("msg", "")
        if e.get("type") == "extra_forbidden":
            name = str(e["loc"][-1])
            renamed = RENAMED.get(model, {}).get(name)
            msg = f"unknown field {name!r}; " + (
                f"this route calls it {renamed!r}" if renamed else f"the body takes {', '.join(model.model_fields)}"
            )
        detail.append({"loc": ["body", *e.get("loc", ())], "msg": msg, "type": e.get("type", "")})
    return _json({"detail": detail}, 422)


def _json(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Serialise with pydantic-core's Rust encoder: the response body is most of a request's cost."""
    return Response(to_json(content), status_code=status_code, media_type="application/json", headers=headers)


def _search_r1_items(answers: list[_Answer], return_scores: bool) -> list[Any]:
    """Search-R1 wire format, one list per query: `[{"document": {"id", "contents"}, "score"}...]`."""
    if return_scores:
        return [
            [{"document": {"id": h.doc_id, "contents": h.contents}, "score": h.score} for h in a.hits] for a in answers
        ]
    return [[{"id": h.doc_id, "contents": h.contents} for h in a.hits] for a in answers]


def _native_items(answers: list[_Answer]) -> list[Any]:
    """Native format, one list per query: `[{"doc_id", "score", "text", "title"}...]`."""
    return [[{"doc_id": h.doc_id, "score": h.score, "text": h.text, "title": h.title} for h in a.hits] for a in answers]


def _search_with_windows(retriever: Retriever | None) -> Any:
    """The batcher's search: the retriever's hits, plus the token window each query passed (if it has one)."""
    window_check = getattr(retriever, "over_window", None)

    def search(queries: list[str], k: int, *options: Any) -> list[_Answer]:
        assert retriever is not None, "a rerank-only server has no search routes"
        hits = retriever.search(queries, k, *options)  # type: ignore[call-arg]
        over = window_check(queries) if window_check is not None else {}
        return [_Answer(h, over.get(i)) for i, h in enumerate(hits)]

    return search


def _backend_stats(retriever: Retriever | None) -> dict[str, Any]:
    """`{"backend": ...}` from a retriever (or a reranker's base) that keeps its own counters, e.g. online search."""
    for candidate in (retriever, getattr(retriever, "base", None)):
        stats = getattr(candidate, "stats", None)
        if callable(stats):
            return {"backend": stats()}
    return {}


def _rerank_contents(body: RerankRequest, limits: ServerLimits) -> list[list[str]] | Response:
    """Each query's documents' `contents`, or the 422 for a body whose lists do not pair up with its queries, hold
    more than max_topk documents, or hold an item without `contents`."""
    from rlloom.retrieval.rerank import document_contents

    if len(body.documents) != len(body.queries):
        return _invalid(
            ("documents",),
            f"one list of documents per query: {len(body.queries)} queries, {len(body.documents)} lists",
        )
    out: list[list[str]] = []
    for i, docs in enumerate(body.documents):
        if len(docs) > limits.max_topk:
            return _invalid(
                ("documents", i),
                f"{len(docs)} documents exceed max_topk ({limits.max_topk}) a query; send fewer, or start the "
                f"server with `--limit max_topk={len(docs)}`",
            )
        row = []
        for j, item in enumerate(docs):
            try:
                row.append(document_contents(item))
            except ValueError as err:
                return _invalid(("documents", i, j), str(err))
        out.append(row)
    return out


class _ResponseTooLargeError(Exception):
    """The answer passed max_response_bytes."""


def create_app(
    retriever: Retriever | None,
    limits: ServerLimits | None = None,
    info: dict[str, Any] | None = None,
    *,
    scorer: Any | None = None,
    passage_format: str = "search-r1",
) -> FastAPI:
    """A FastAPI app serving `retriever`; `info` (backend, doc count, index path) is echoed by /health.

    The query routes read the raw body and validate it with pydantic's JSON parser instead of going through
    FastAPI's per-request dependency machinery: at a few hundred microseconds of backend time per query, request
    handling is the cost that decides throughput. A `rerank.RerankingRetriever` also takes Search-R1's
    `retrieval_rerank_server` fields on /retrieve (`topk_retrieval`, `topk_rerank`) and answers /rerank with its
    cross-encoder; `scorer` (a `rerank.CrossEncoderScorer`) serves /rerank alone when `retriever` is None.
    """
    from rlloom.retrieval.rerank import RerankingRetriever

    limits = limits or ServerLimits()
    reranking = isinstance(retriever, RerankingRetriever)
    if isinstance(retriever, RerankingRetriever):
        scorer, passage_format = retriever.scorer, retriever.config.passage_format
    if retriever is None and scorer is None:
        raise ValueError("create_app needs a retriever, a cross-encoder scorer, or both")
    batcher: MicroBatcher[_Answer] = MicroBatcher(
        search=_search_with_windows(retriever),
        trim=_trim,
        window_s=limits.batch_window_ms / 1000,
        max_batch_queries=limits.max_batch_queries,
        max_pending_queries=limits.max_pending_queries,
    )
    latency = LatencyWindow()
    counters = {
        "requests": 0,
        "queries": 0,
        "truncated_queries": 0,
        "rejected_503": 0,
        "invalid_422": 0,
        "too_large_413": 0,
        "response_too_large_413": 0,
        "timed_out_408": 0,
        "errors_500": 0,
        "rerank_requests": 0,
    }
    started = time.time()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        # Everything loaded so far (index, vocabulary, framework) lives as long as the server: keep it out of the
        # collector's full passes, which otherwise stall every in-flight request for tens of ms twice a second.
        if limits.freeze_gc:
            gc.freeze()
        yield
        await batcher.stop()

    app = FastAPI(title="rlloom retrieval", lifespan=lifespan)

    async def run(
        route: str,
        queries: list[str],
        k: int,
        *,
        k_field: str,
        render: Any,
        key: bytes,
        options: tuple[Any, ...] = (),
    ) -> Response:
        """Search `queries` in pieces of max_batch_queries and write the answer `{key: [...]}` piece by piece."""
        invalid = _check(queries, k, k_field, limits)
        if invalid is not None:
            counters["invalid_422"] += 1
            return invalid
        sent = queries
        queries, cut = _truncate(queries, limits.max_query_chars)
        t0 = time.perf_counter()
        parts: list[bytes] = []
        size = 0
        step = limits.max_batch_queries
        try:
            for lo in range(0, len(queries), step):
                answers = await batcher.submit(queries[lo : lo + step], k, options)
                for i, answer in enumerate(answers, start=lo):
                    if answer.window is not None:
                        cut[i] = answer.window
                part = to_json(render(answers))[1:-1]  # the piece's lists, without the enclosing brackets
                size += len(part) + 1
                if size > limits.max_response_bytes:
                    raise _ResponseTooLargeError(lo + len(answers))
                parts.append(part)
        except OverloadedError as err:
            counters["rejected_503"] += 1
            return _json({"detail": str(err)}, 503, {"Retry-After": "1"})
        except _ResponseTooLargeError as err:
            counters["response_too_large_413"] += 1
            detail = (
                f"the answer passed max_response_bytes ({limits.max_response_bytes} bytes) after {err.args[0]} of "
                f"{len(queries)} queries at topk {k}; send fewer queries or a smaller topk per request, or start the "
                "server with a larger `--limit max_response_bytes=N`"
            )
            return _json({"detail": detail}, 413)
        except Exception as err:
            counters["errors_500"] += 1
            return _json({"detail": f"retrieval failed: {type(err).__name__}: {err}"}, 500)
        latency.add(time.perf_counter() - t0)
        counters["requests"] += 1
        counters["queries"] += len(queries)
        body = b'{"' + key + b'":[' + b",".join(parts) + b"]"
        if cut:  # an extra field: Search-R1's client reads only `result`
            counters["truncated_queries"] += len(cut)
            report = [{"index": i, "chars": len(sent[i]), "limit": cut[i]} for i in sorted(cut)]
            body += b',"truncated_queries":' + to_json(report)
            first = report[0]
            logger.warning(
                "%s: %d of %d queries cut to fit (query %d: %d characters, limit %s)",
                route,
                len(cut),
                len(queries),
                first["index"],
                first["chars"],
                first["limit"],
            )
        return Response(body + b"}", media_type="application/json")

    async def answer_retrieve(raw: bytes) -> Response:
        model = RerankRetrieveRequest if reranking else RetrieveRequest
        try:
            body = model.model_validate_json(raw)
        except ValidationError as err:
            counters["invalid_422"] += 1
            return _schema_error(err, model)
        # Search-R1's server: `if not request.topk`, so 0 is the default too
        k, k_field = body.topk or limits.default_topk, "topk"
        options: tuple[int, ...] = ()
        if isinstance(body, RerankRetrieveRequest):
            if body.topk_rerank:
                k, k_field = body.topk_rerank, "topk_rerank"
            if body.topk_retrieval:
                if body.topk_retrieval > limits.max_topk or body.topk_retrieval < 1:
                    counters["invalid_422"] += 1
                    return _invalid(
                        ("topk_retrieval",), f"must be between 1 and {limits.max_topk}, got {body.topk_retrieval}"
                    )
                options = (body.topk_retrieval,)
        scores = body.return_scores
        return await run(
            "/retrieve",
            body.queries,
            k,
            k_field=k_field,
            render=lambda answers: _search_r1_items(answers, scores),
            key=b"result",
            options=options,
        )

    async def answer_search(raw: bytes) -> Response:
        try:
            body = SearchRequest.model_validate_json(raw)
        except ValidationError as err:
            counters["invalid_422"] += 1
            return _schema_error(err, SearchRequest)
        return await run("/search", body.queries, body.k, k_field="k", render=_native_items, key=b"results")

    async def answer_rerank(raw: bytes) -> Response:
        from rlloom.retrieval.rerank import rerank_documents

        try:
            body = RerankRequest.model_validate_json(raw)
        except ValidationError as err:
            counters["invalid_422"] += 1
            return _schema_error(err, RerankRequest)
        k = body.rerank_topk or limits.default_topk  # Search-R1: `if not request.rerank_topk`, its default 3
        contents = _check(body.queries, k, "rerank_topk", limits) or _rerank_contents(body, limits)
        if isinstance(contents, Response):
            counters["invalid_422"] += 1
            return contents
        t0 = time.perf_counter()
        try:  # the cross-encoder runs off the event loop: /health and other requests stay answered
            ranked = await asyncio.to_thread(rerank_documents, scorer, body.queries, contents, k, passage_format)
        except Exception as err:
            counters["errors_500"] += 1
            return _json({"detail": f"reranking failed: {type(err).__name__}: {err}"}, 500)
        latency.add(time.perf_counter() - t0)
        counters["rerank_requests"] += 1
        if body.return_scores:
            return _json({"result": [[{"document": d, "score": s} for d, s in q] for q in ranked]})
        return _json({"result": [[d for d, _ in q] for q in ranked]})

    routes: dict[str, Any] = {}
    if retriever is not None:
        routes = {"/retrieve": answer_retrieve, "/search": answer_search}

        @app.post("/retrieve", **route_docs(RerankRetrieveRequest if reranking else RetrieveRequest, RetrieveResponse))
        async def retrieve(request: Request) -> Response:
            """Search-R1's endpoint; body `RetrieveRequest`, response `{"result": ...}`."""
            return await answer_retrieve(await request.body())

        @app.post("/search", **route_docs(SearchRequest, SearchResponse))
        async def search(request: Request) -> Response:
            """The native endpoint; body `SearchRequest`, response `{"results": [[Hit...]...]}`."""
            return await answer_search(await request.body())

    if scorer is not None:
        routes["/rerank"] = answer_rerank

        @app.post("/rerank", **route_docs(RerankRequest, RerankResponse))
        async def rerank(request: Request) -> Response:
            """Search-R1's `rerank_server.py` endpoint; body `RerankRequest`, response `{"result": ...}`."""
            return await answer_rerank(await request.body())

    body_limit = limits.body_limit()

    def too_large() -> Response:
        counters["too_large_413"] += 1
        detail = (
            f"request body exceeds {body_limit} bytes; send fewer or shorter queries per request, or start the "
            "server with a larger `--limit max_body_bytes=N`"
        )
        return _json({"detail": detail}, 413)

    def timed_out() -> Response:
        counters["timed_out_408"] += 1
        detail = (
            f"the request body did not arrive within {limits.body_timeout_s:g} s; send it at once, or start the "
            "server with a larger body_timeout_s"
        )
        return _json({"detail": detail}, 408, {"Connection": "close"})

    app.add_middleware(
        QueryFastPath,
        routes=routes,
        max_body_bytes=body_limit,
        too_large=too_large,
        body_timeout_s=limits.body_timeout_s,
        timed_out=timed_out,
    )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", **(info or {})}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        b = batcher.stats
        return {
            **counters,
            "pending_queries": batcher.pending_queries,
            "batches": b.batches,
            "mean_batch_queries": round(b.batched_queries / b.batches, 3) if b.batches else None,
            "largest_batch": b.largest_batch,
            "backend_seconds": round(b.backend_seconds, 4),
            "latency_ms": latency.percentiles_ms(),
            "uptime_s": round(time.time() - started, 1),
            "pid": os.getpid(),  # with --workers N each worker process keeps its own counters
            **_backend_stats(retriever),
        }

    return app
