"""HTTP clients for a retrieval server (ours or Search-R1's), implementing the same `search` as a local index.

One pooled httpx client per object; each call has a timeout and is retried with exponential backoff and jitter on
connection errors, timeouts and 502/503/504 (a 503 from our server means "queue full, retry"). Other 4xx/5xx
answers raise `RetrievalError` with the server's message, since repeating a bad request cannot help.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import random
import time
from typing import Any, Literal

import httpx

from rlloom.retrieval.corpus import split_contents
from rlloom.retrieval.types import Hit

RETRY_STATUS = frozenset({502, 503, 504})
Api = Literal["native", "search-r1"]


class RetrievalError(RuntimeError):
    """The server rejected a request or stayed unavailable after all retries."""


def _request(api: Api, queries: list[str], k: int) -> tuple[str, dict[str, Any]]:
    if api == "native":
        return "/search", {"queries": queries, "k": k}
    return "/retrieve", {"queries": queries, "topk": k, "return_scores": True}


def _search_r1_hit(item: dict[str, Any]) -> Hit:
    """One Search-R1 result item: `{document, score}` or a bare document.

    Its dense server returns corpus rows (`id`, `contents`); its Lucene (BM25) server returns `title`, `text` and
    `contents` but no `id`. A document without one gets `contents:<sha1 of its contents>`, stable across calls
    (so repeated passages stay recognisable) and never mistaken for a corpus id.
    """
    doc = item.get("document", item)
    contents = doc.get("contents")
    if contents is None:  # title and text only
        contents = f'"{doc["title"]}"\n{doc["text"]}' if doc.get("title") is not None else doc["text"]
    title, text = split_contents(str(contents))
    doc_id = doc.get("id")
    if doc_id is None:
        doc_id = "contents:" + hashlib.sha1(str(contents).encode(), usedforsecurity=False).hexdigest()[:16]
    return Hit(doc_id=str(doc_id), score=float(item.get("score", 0.0)), text=text, title=title)


def _parse(api: Api, body: Any, n_queries: int) -> list[list[Hit]]:
    if api == "native":
        results = [[Hit.model_validate(h) for h in hits] for hits in body["results"]]
    else:
        results = [[_search_r1_hit(item) for item in hits] for hits in body["result"]]
    if len(results) != n_queries:
        raise RetrievalError(f"server answered {len(results)} result lists for {n_queries} queries")
    return results


def _results(api: Api, response: httpx.Response, n_queries: int) -> list[list[Hit]]:
    """A 200's hits; a body that is not the API's JSON (a proxy's HTML page, another service) is a RetrievalError
    saying what came back, not a KeyError from deep in the parser."""
    try:
        return _parse(api, response.json(), n_queries)
    except RetrievalError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise RetrievalError(
            f"{response.request.url} answered 200 with a body that is not a {api} retrieval response "
            f"({type(err).__name__}: {err}); body starts {response.text[:120]!r}. Is the URL the retrieval server's?"
        ) from err


MAX_RETRY_AFTER_S = 60.0
"""The longest Retry-After honoured: a server asking for more (or for `inf`) must not park a rollout for good."""


def _pause(response: httpx.Response | None, attempt: int, base: float) -> float:
    """Seconds before the next try: the backoff, or the server's Retry-After (seconds, at most MAX_RETRY_AFTER_S)
    when it asks for longer."""
    wait = _backoff(attempt, base)
    if response is not None:
        with contextlib.suppress(ValueError):  # an HTTP date or junk: keep the backoff
            asked = float(response.headers.get("retry-after", 0))
            if not math.isnan(asked):  # 'nan' is junk too; 'inf' gets the cap
                wait = max(wait, min(asked, MAX_RETRY_AFTER_S))
    return wait


def _error(response: httpx.Response) -> RetrievalError:
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    return RetrievalError(f"{response.request.url} answered {response.status_code}: {detail}")


def _check_settings(retries: int, backoff: float, max_connections: int) -> None:
    """Refuse settings that would fail later in a confusing way (`retries=-1` made no request at all)."""
    if retries < 0:
        raise ValueError(f"retries must be >= 0 (0 = one try, no retry), got {retries}")
    if backoff < 0:
        raise ValueError(f"backoff must be >= 0 seconds, got {backoff}")
    if max_connections < 1:
        raise ValueError(f"max_connections must be >= 1, got {max_connections}")


def _backoff(attempt: int, base: float) -> float:
    return base * (2**attempt) * (0.5 + random.random())


class RetrievalClient:
    """Blocking client; `search(queries, k)` like any `Retriever`. Use as a context manager or call `close()`."""

    def __init__(
        self,
        base_url: str,
        *,
        api: Api = "native",
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.1,
        max_connections: int = 64,
    ) -> None:
        _check_settings(retries, backoff, max_connections)
        self.api, self.retries, self.backoff = api, retries, backoff
        self._http = httpx.Client(
            base_url=base_url,
            timeout=timeout,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        path, payload = _request(self.api, queries, k)
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            response: httpx.Response | None = None
            try:
                response = self._http.post(path, json=payload)
            except httpx.TransportError as err:
                if last:
                    raise RetrievalError(
                        f"{self._http.base_url}{path} unreachable after {attempt + 1} tries: {err}"
                    ) from err
            else:
                if response.status_code == 200:
                    return _results(self.api, response, len(queries))
                if response.status_code not in RETRY_STATUS or last:
                    raise _error(response)
            time.sleep(_pause(response, attempt, self.backoff))
        raise AssertionError("unreachable")

    def health(self) -> dict[str, Any]:
        response = self._http.get("/health")
        response.raise_for_status()
        return dict(response.json())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRetrievalClient:
    """asyncio client: `await client.search(queries, k)`; many concurrent calls share one connection pool."""

    def __init__(
        self,
        base_url: str,
        *,
        api: Api = "native",
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.1,
        max_connections: int = 64,
    ) -> None:
        _check_settings(retries, backoff, max_connections)
        self.api, self.retries, self.backoff = api, retries, backoff
        # httpcore's pool slows down quadratically with the requests waiting for a connection (4,000 concurrent
        # `search` calls stalled for minutes, then hit PoolTimeout): queue them here, at most one per connection.
        self._slots = asyncio.Semaphore(max_connections)
        self._http = httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        path, payload = _request(self.api, queries, k)
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            response: httpx.Response | None = None
            try:
                async with self._slots:
                    response = await self._http.post(path, json=payload)
            except httpx.TransportError as err:
                if last:
                    raise RetrievalError(
                        f"{self._http.base_url}{path} unreachable after {attempt + 1} tries: {err}"
                    ) from err
            else:
                if response.status_code == 200:
                    return _results(self.api, response, len(queries))
                if response.status_code not in RETRY_STATUS or last:
                    raise _error(response)
            await asyncio.sleep(_pause(response, attempt, self.backoff))
        raise AssertionError("unreachable")

    async def health(self) -> dict[str, Any]:
        response = await self._http.get("/health")
        response.raise_for_status()
        return dict(response.json())

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRetrievalClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
