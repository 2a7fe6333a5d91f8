"""What a retrieval server answers from, and starting it: an index folder or an online engine (optionally behind
a cross-encoder), or a cross-encoder alone (Search-R1's `rerank_server.py`: /rerank only), as a `Source`; the app
for it, and `serve` (uvicorn, one or more worker processes, which read the source from the environment). The
request handling itself is `server.create_app`.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlloom.retrieval.server import ServerLimits, create_app, uvicorn_options
from rlloom.retrieval.types import Retriever

__all__ = ["Source", "app_for_index", "app_for_source", "app_from_environment", "load_source", "serve"]

_ENV_SOURCE = "RLLOOM_RETRIEVAL_SOURCE"
_ENV_LIMITS = "RLLOOM_RETRIEVAL_LIMITS"


class Source(BaseModel):
    """What a server answers from: an index folder or an online engine, optionally behind a cross-encoder; or a
    cross-encoder alone, answering /rerank."""

    model_config = ConfigDict(extra="forbid")

    index: str | None = Field(default=None, description="An index folder made by build-index or an import.")
    online: Literal["google", "serpapi"] | None = Field(default=None, description="An online search engine.")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="index: query-time overrides (load_index); online: the engine's config fields (online.py).",
    )
    rerank: dict[str, Any] | None = Field(
        default=None, description="rerank.RerankConfig fields (model=DIR, depth, ...): rerank the candidates."
    )

    def check(self) -> None:
        if self.index is not None and self.online is not None:
            raise ValueError("serve one source: an index folder (--index) or an online engine (--online)")
        if self.index is None and self.online is None and self.rerank is None:
            raise ValueError(
                "serve an index folder (--index), an online engine (--online), or a cross-encoder alone "
                "(--rerank-model DIR: Search-R1's /rerank)"
            )
        if self.index is None and self.online is None and self.options:
            raise ValueError(f"--opt {', '.join(self.options)}: a cross-encoder alone takes --rerank-opt, not --opt")


def _rerank_config(options: dict[str, Any]) -> Any:
    from rlloom.retrieval.rerank import RerankConfig

    try:
        return RerankConfig(**options)
    except ValidationError as err:
        parts = []
        for e in err.errors(include_url=False):
            name = ".".join(str(p) for p in e["loc"]) or "options"
            message = str(e["msg"]).removeprefix("Value error, ")
            parts.append(f"{name}={e.get('input')!r}: {message}" if e["type"] != "missing" else f"{name} is required")
        raise ValueError("reranker: " + "; ".join(parts)) from None


def load_source(source: Source) -> tuple[Retriever | None, dict[str, Any]]:
    """The retriever a `Source` describes (None for a cross-encoder alone), and what /health says about it."""
    source.check()
    retriever: Retriever | None
    info: dict[str, Any]
    if source.index is None and source.online is None:
        retriever, info = None, {"backend": "rerank"}
    elif source.index is not None:
        from rlloom.retrieval.index import load_index

        loaded = load_index(source.index, **source.options)
        retriever = loaded
        info = {
            "backend": loaded.manifest.backend,
            "doc_count": loaded.manifest.doc_count,
            "index": str(source.index),
        }
    else:
        from rlloom.retrieval.online import online_backend

        assert source.online is not None
        retriever = online_backend(source.online, **source.options)
        info = {"backend": source.online}
    if source.rerank is not None and retriever is not None:
        from rlloom.retrieval.rerank import RerankingRetriever

        config = _rerank_config(source.rerank)
        retriever = RerankingRetriever(retriever, config)
        info.update(rerank_model=config.model, rerank_depth=config.depth)
    return retriever, info


def app_for_source(source: Source, limits: ServerLimits | None = None) -> FastAPI:
    """Load a `Source` and serve it."""
    retriever, info = load_source(source)
    if retriever is None:  # a cross-encoder alone: /rerank
        from rlloom.retrieval.rerank import CrossEncoderScorer

        config = _rerank_config(source.rerank or {})
        info.update(rerank_model=config.model)
        return create_app(None, limits, info, scorer=CrossEncoderScorer(config), passage_format=config.passage_format)
    return create_app(retriever, limits, info)


def app_for_index(index: str | Path, limits: ServerLimits | None = None, **overrides: Any) -> FastAPI:
    """Load an index folder and serve it."""
    return app_for_source(Source(index=str(index), options=overrides), limits)


def app_from_environment() -> FastAPI:
    """uvicorn factory for `--workers N`: each worker process loads the source described in the environment."""
    raw = os.environ.get(_ENV_SOURCE)
    if not raw:
        raise RuntimeError(f'set {_ENV_SOURCE} to a Source as JSON, e.g. {{"index": "indexes/wiki-bm25"}}')
    limits = ServerLimits.model_validate_json(os.environ.get(_ENV_LIMITS, "{}"))
    return app_for_source(Source.model_validate_json(raw), limits)


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
    index: str | Path | None = None,
    *,
    online: str | None = None,
    rerank: dict[str, Any] | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    limits: ServerLimits | None = None,
    log_level: str = "warning",
    **options: Any,
) -> None:
    """Serve an index folder (`index`) or an online engine (`online="google"|"serpapi"`), optionally reranked
    (`rerank`: `RerankConfig` fields), until interrupted; with workers > 1 each uvicorn worker process loads it.

    `options` are the index's query-time overrides, or the online engine's settings. Checks the port, the
    options, API keys and the reranker's folder first, and prints `serving ... on http://host:port` only once
    the source is loaded and the port is free, right before uvicorn binds it.
    """
    import uvicorn

    limits = limits or ServerLimits()
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    source = Source.model_validate(
        {"index": None if index is None else str(Path(index).resolve()), "online": online, "options": options,
         "rerank": rerank}
    )  # fmt: skip
    source.check()
    check_port(host, port)
    if source.index is not None:
        from rlloom.retrieval.index import check_load_options
        from rlloom.retrieval.manifest import read_manifest

        check_load_options(Path(source.index), read_manifest(source.index), options)
    what = index if index is not None else f"{online} search" if online is not None else None
    if rerank is not None:
        what = f"{what}, reranked by {rerank.get('model')}" if what else f"/rerank with {rerank.get('model')}"
    announce = f"serving {what} on http://{host}:{port} ({workers} worker(s))"
    if workers == 1:
        app = app_for_source(source, limits)
        print(announce, flush=True)
        uvicorn.run(app, host=host, port=port, log_level=log_level, **uvicorn_options(limits))
        return
    if source.online is not None:  # keys and options: fail here in one line, not in every worker
        from rlloom.retrieval.online import online_backend

        online_backend(source.online, **options).close()
    if rerank is not None:
        _rerank_config(rerank)
    os.environ[_ENV_SOURCE] = source.model_dump_json()
    os.environ[_ENV_LIMITS] = limits.model_dump_json()
    print(announce, flush=True)
    uvicorn.run(
        "rlloom.retrieval.serving:app_from_environment",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        **uvicorn_options(limits),
    )
