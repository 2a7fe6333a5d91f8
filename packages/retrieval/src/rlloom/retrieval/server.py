"""The retrieval HTTP server: Search-R1's `POST /retrieve`, the native `POST /search`, `/health` and `/stats`.

Requests from all clients go through one `MicroBatcher`, so 32 agents asking one query each cost about one
backend call, not 32. Limits (queries per request, topk, query length) answer 422 naming the field; a full queue
answers 503 at once; any backend error answers 500 for that request only. A body that stalls gets 408 and its
connection closed; idle connections are closed and open ones capped (`uvicorn_options`), so slow or stuck
clients cannot use up the process's file descriptors.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
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
    RetrieveRequest,
    RetrieveResponse,
    SearchRequest,
    SearchResponse,
    route_docs,
)

__all__ = ["RetrieveRequest", "SearchRequest", "ServerLimits", "app_for_index", "create_app", "serve"]


class ServerLimits(BaseModel):
    """Request limits and batching knobs (all per worker process)."""

    model_config = ConfigDict(extra="forbid")

    max_queries: int = Field(default=512, gt=0, description="Queries per request.")
    max_topk: int = Field(default=100, gt=0, description="Largest topk/k a request may ask for.")
    max_query_chars: int = Field(default=4096, gt=0, description="Characters per query.")
    default_topk: int = Field(
        default=3, gt=0, description="topk when a /retrieve request sends null (Search-R1 uses 3)."
    )
    max_body_bytes: int | None = Field(
        default=None,
        gt=0,
        description="Largest request body; a larger one gets 413 without being read whole. Default: room for "
        "max_queries queries of max_query_chars characters, JSON-escaped (6 bytes a character), plus 64 KiB.",
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
        """`max_body_bytes`, or room for the largest request the other limits allow."""
        return self.max_body_bytes or self.max_queries * self.max_query_chars * 6 + 65_536

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
        return _invalid(("queries",), f"{len(queries)} queries exceed the limit of {limits.max_queries} per request")
    if k < 1 or k > limits.max_topk:
        return _invalid((k_field,), f"must be between 1 and {limits.max_topk}, got {k}")
    for i, query in enumerate(queries):
        if len(query) > limits.max_query_chars:  # same loc shape as pydantic's: ["body", "queries", i]
            return _invalid(("queries", i), f"{len(query)} characters exceed the limit of {limits.max_query_chars}")
    return None


def _trim(hits: list[Hit], k: int) -> list[Hit]:
    return hits[:k]


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


def _search_r1_body(results: list[list[Hit]], return_scores: bool) -> dict[str, Any]:
    """Search-R1 wire format: `{"result": [[{"document": {"id", "contents"}, "score"}...]...]}`."""
    if return_scores:
        return {
            "result": [
                [{"document": {"id": h.doc_id, "contents": h.contents}, "score": h.score} for h in hits]
                for hits in results
            ]
        }
    return {"result": [[{"id": h.doc_id, "contents": h.contents} for h in hits] for hits in results]}


def _native_body(results: list[list[Hit]]) -> dict[str, Any]:
    """Native format: `{"results": [[{"doc_id", "score", "text", "title"}...]...]}`."""
    return {
        "results": [
            [{"doc_id": h.doc_id, "score": h.score, "text": h.text, "title": h.title} for h in hits] for hits in results
        ]
    }


def create_app(retriever: Retriever, limits: ServerLimits | None = None, info: dict[str, Any] | None = None) -> FastAPI:
    """A FastAPI app serving `retriever`; `info` (backend, doc count, index path) is echoed by /health.

    The two query routes read the raw body and validate it with pydantic's JSON parser instead of going through
    FastAPI's per-request dependency machinery: at a few hundred microseconds of backend time per query, request
    handling is the cost that decides throughput.
    """
    limits = limits or ServerLimits()
    batcher: MicroBatcher[list[Hit]] = MicroBatcher(
        search=retriever.search,
        trim=_trim,
        window_s=limits.batch_window_ms / 1000,
        max_batch_queries=limits.max_batch_queries,
        max_pending_queries=limits.max_pending_queries,
    )
    latency = LatencyWindow()
    counters = {
        "requests": 0,
        "queries": 0,
        "rejected_503": 0,
        "invalid_422": 0,
        "too_large_413": 0,
        "timed_out_408": 0,
        "errors_500": 0,
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

    async def run(queries: list[str], k: int, k_field: str) -> list[list[Hit]] | Response:
        invalid = _check(queries, k, k_field, limits)
        if invalid is not None:
            counters["invalid_422"] += 1
            return invalid
        if not queries:  # Search-R1's trainer asks on turns where no conversation searched
            counters["requests"] += 1
            return []
        t0 = time.perf_counter()
        try:
            results = await batcher.submit(queries, k)
        except OverloadedError as err:
            counters["rejected_503"] += 1
            return _json({"detail": str(err)}, 503, {"Retry-After": "1"})
        except Exception as err:
            counters["errors_500"] += 1
            return _json({"detail": f"retrieval failed: {type(err).__name__}: {err}"}, 500)
        latency.add(time.perf_counter() - t0)
        counters["requests"] += 1
        counters["queries"] += len(queries)
        return results

    async def answer_retrieve(raw: bytes) -> Response:
        try:
            body = RetrieveRequest.model_validate_json(raw)
        except ValidationError as err:
            counters["invalid_422"] += 1
            return _schema_error(err, RetrieveRequest)
        k = body.topk or limits.default_topk  # Search-R1's server: `if not request.topk`, so 0 is the default too
        results = await run(body.queries, k, "topk")
        return results if isinstance(results, Response) else _json(_search_r1_body(results, body.return_scores))

    async def answer_search(raw: bytes) -> Response:
        try:
            body = SearchRequest.model_validate_json(raw)
        except ValidationError as err:
            counters["invalid_422"] += 1
            return _schema_error(err, SearchRequest)
        results = await run(body.queries, body.k, "k")
        return results if isinstance(results, Response) else _json(_native_body(results))

    @app.post("/retrieve", **route_docs(RetrieveRequest, RetrieveResponse))
    async def retrieve(request: Request) -> Response:
        """Search-R1's endpoint; body `RetrieveRequest`, response `{"result": ...}`."""
        return await answer_retrieve(await request.body())

    @app.post("/search", **route_docs(SearchRequest, SearchResponse))
    async def search(request: Request) -> Response:
        """The native endpoint; body `SearchRequest`, response `{"results": [[Hit...]...]}`."""
        return await answer_search(await request.body())

    body_limit = limits.body_limit()

    def too_large() -> Response:
        counters["too_large_413"] += 1
        detail = (
            f"request body exceeds {body_limit} bytes; send fewer or shorter queries per request, or start the "
            "server with a larger max_body_bytes"
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
        routes={"/retrieve": answer_retrieve, "/search": answer_search},
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
        }

    return app


_ENV_INDEX = "RLLOOM_RETRIEVAL_INDEX"
_ENV_LIMITS = "RLLOOM_RETRIEVAL_LIMITS"
_ENV_OVERRIDES = "RLLOOM_RETRIEVAL_OVERRIDES"


def app_for_index(index: str | Path, limits: ServerLimits | None = None, **overrides: Any) -> FastAPI:
    """Load an index folder and serve it."""
    from rlloom.retrieval.index import load_index

    retriever = load_index(index, **overrides)
    info = {"backend": retriever.manifest.backend, "doc_count": retriever.manifest.doc_count, "index": str(index)}
    return create_app(retriever, limits, info)


def app_from_environment() -> FastAPI:
    """uvicorn factory for `--workers N`: each worker process loads the index named in the environment."""
    index = os.environ.get(_ENV_INDEX)
    if not index:
        raise RuntimeError(f"set {_ENV_INDEX} to an index folder")
    limits = ServerLimits.model_validate_json(os.environ.get(_ENV_LIMITS, "{}"))
    return app_for_index(index, limits, **json.loads(os.environ.get(_ENV_OVERRIDES, "{}")))


def check_port(host: str, port: int) -> None:
    """Fail in one line, before the index loads, when uvicorn could not bind `host:port` (in use, or not allowed).

    Binds with SO_REUSEADDR like uvicorn, so a port in TIME_WAIT from a stopped server still counts as free.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise OSError(f"--host {host} does not resolve ({err.strerror}); pass an address such as 127.0.0.1") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            raise OSError(
                f"--port {port}: cannot listen on {host}:{port} ({err.strerror}); stop whatever holds the port "
                "or pass another --port"
            ) from None


def serve(
    index: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    limits: ServerLimits | None = None,
    log_level: str = "warning",
    **overrides: Any,
) -> None:
    """Run the server until interrupted; with workers > 1 each uvicorn worker process loads the index itself.

    Checks the port and the overrides first and prints `serving ... on http://host:port` only once the index
    is loaded and the port is free, right before uvicorn binds it.
    """
    import uvicorn

    from rlloom.retrieval.index import check_load_options
    from rlloom.retrieval.manifest import read_manifest

    limits = limits or ServerLimits()
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    check_port(host, port)
    check_load_options(Path(index), read_manifest(index), overrides)
    announce = f"serving {index} on http://{host}:{port} ({workers} worker(s))"
    if workers == 1:
        app = app_for_index(index, limits, **overrides)
        print(announce, flush=True)
        uvicorn.run(app, host=host, port=port, log_level=log_level, **uvicorn_options(limits))
        return
    os.environ[_ENV_INDEX] = str(Path(index).resolve())
    os.environ[_ENV_LIMITS] = limits.model_dump_json()
    os.environ[_ENV_OVERRIDES] = json.dumps(overrides)
    print(announce, flush=True)
    uvicorn.run(
        "rlloom.retrieval.server:app_from_environment",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        **uvicorn_options(limits),
    )
