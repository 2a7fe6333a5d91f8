"""Online search backends with Search-R1's server API: Google Custom Search and SerpAPI, as `Retriever`s.

Search-R1 ships `search_r1/search/google_search_server.py` and `serp_search_server.py`; here the same vendors are
`Retriever`s, so `rlloom-retrieval serve --online google|serpapi` answers Search-R1's `POST /retrieve` (and the
native `/search`) with the server's batching, limits and `/stats`, and a reranker can sit on top.

- Keys come from the environment (`GOOGLE_API_KEY` and `GOOGLE_CSE_ID`; `SERPAPI_API_KEY`); a missing one is a
  `MissingKeyError` naming the variable, raised when the backend is made, before the server starts.
- Results are cached: an in-process LRU, plus an SQLite file shared across processes and runs with `cache_dir`
  (entries expire after `cache_ttl_s`, 7 days by default, DeepResearcher's choice). A query repeated within one
  batch is asked once.
- Requests are spaced to at most `max_qps` per process and run `max_concurrency` at a time; connection errors,
  429 and 5xx answers are retried `retries` times with exponential backoff and jitter (a `Retry-After` is
  honoured up to 60 s). Any other vendor error raises `OnlineSearchError` carrying the vendor's own message,
  which the server returns in its 500 answer.
- Passages are Search-R1's: `contents` is `"title"\\nsnippet`; `doc_id` is the result's link; results carry no
  relevance score, so `score` is 1/rank.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import httpx
from pydantic import BaseModel, ConfigDict, Field

from rlloom.retrieval.pages import PageFetcher, collect_context, html_links
from rlloom.retrieval.types import Hit

__all__ = [
    "GoogleSearch",
    "GoogleSearchConfig",
    "MissingKeyError",
    "OnlineSearchError",
    "SerpApiSearch",
    "SerpApiSearchConfig",
    "online_backend",
]

MAX_RETRY_AFTER_S = 60.0
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class OnlineSearchError(RuntimeError):
    """The search vendor refused a request or stayed unavailable after all retries; the message is the vendor's."""


class MissingKeyError(ValueError):
    """An API key or engine id is not in the environment; the message names the variable."""


class OnlineConfig(BaseModel):
    """Settings shared by the online backends (all per process)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(default=None, description="The vendor's endpoint; default its public URL.")
    timeout_s: float = Field(default=15.0, gt=0, description="Seconds per HTTP request.")
    retries: int = Field(default=3, ge=0, description="Retries of a request after a connection error, 429 or 5xx.")
    backoff_s: float = Field(default=0.5, ge=0, description="First retry's wait; doubles each retry (with jitter).")
    max_qps: float = Field(default=5.0, gt=0, description="Requests per second to the vendor, at most.")
    max_concurrency: int = Field(default=8, gt=0, description="Requests in flight at once.")
    cache_size: int = Field(default=100_000, ge=0, description="Queries kept in the in-process LRU cache; 0: none.")
    cache_dir: str | None = Field(
        default=None, description="Folder for a persistent SQLite cache shared by processes and runs; None: none."
    )
    cache_ttl_s: float | None = Field(default=7 * 86_400, gt=0, description="Seconds a cached answer is served.")
    sanitize: bool = Field(
        default=True,
        description="Replace non-word characters by spaces and collapse whitespace before sending, as Search-R1's "
        "Google server does (also makes the cache key insensitive to punctuation).",
    )


class GoogleSearchConfig(OnlineConfig):
    """Google Custom Search JSON API (`customsearch/v1`): `items[].title/.snippet/.link`, 10 results a page."""

    URL: ClassVar[str] = "https://www.googleapis.com/customsearch/v1"

    api_key_env: str = Field(default="GOOGLE_API_KEY", description="Environment variable holding the API key.")
    cse_id_env: str = Field(default="GOOGLE_CSE_ID", description="Environment variable holding the engine id (cx).")
    snippet_filter: bool = Field(
        default=True,
        description="Search-R1's snippet_only parsing: keep the '...'-separated parts of a snippet that have more "
        "than 5 words ('No snippet available.' when none has).",
    )
    full_page: bool = Field(
        default=False,
        description="Search-R1's full-page mode (its server without --snippet_only): fetch each result's page and "
        "answer with its paragraphs that hold the snippet's sentences (pages.py); a page that fails keeps its snippet.",
    )
    page_timeout_s: float = Field(default=5.0, gt=0, description="Seconds a page may take in all (Search-R1: 5).")
    page_concurrency: int = Field(default=8, gt=0, description="Pages downloaded at once (Search-R1: 8).")
    max_page_bytes: int = Field(
        default=2 * 1024 * 1024, gt=0, description="Bytes of a page read at most; the rest is not downloaded."
    )


class SerpApiSearchConfig(OnlineConfig):
    """SerpAPI (`/search`): `answer_box`, `organic_results[]`, `related_questions[]`."""

    URL: ClassVar[str] = "https://serpapi.com/search"

    api_key_env: str = Field(default="SERPAPI_API_KEY", description="Environment variable holding the API key.")
    engine: str = Field(default="google", description="SerpAPI engine (Search-R1's --serp_engine).")
    answer_box: bool = Field(default=True, description="Put the answer box first, as Search-R1 does.")
    related_questions: bool = Field(default=True, description="Add related questions after the organic results.")
    sanitize: bool = Field(default=False, description="Search-R1's SerpAPI server sends the query as it is.")


def _env(name: str, what: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise MissingKeyError(f"the environment variable {name} is not set; export {name}=<{what}>")
    return value


def sanitize_query(query: str) -> str:
    """Search-R1's `sanitize_search_query`: non-word characters become spaces, whitespace collapses."""
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", " ", query)).strip()


def parse_snippet(snippet: str) -> list[str]:
    """Search-R1's `parse_snippet`: the '...'-separated parts of a Google snippet that have more than 5 words."""
    return [s.strip() for s in snippet.split("...") if len(s.strip().split()) > 5]


class RateLimiter:
    """Spaces calls `1/qps` seconds apart across threads (no bursts)."""

    def __init__(self, qps: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval, self._clock = 1.0 / qps, clock
        self._next = 0.0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            now = self._clock()
            slot = max(now, self._next)
            self._next = slot + self.interval
        if slot > now:
            time.sleep(slot - now)


class ResponseCache:
    """An LRU in memory, optionally backed by an SQLite file (`cache_dir/online-search.sqlite3`)."""

    def __init__(self, size: int, folder: str | None, ttl_s: float | None) -> None:
        self.size, self.ttl_s = size, ttl_s
        self._memory: OrderedDict[str, tuple[float, list[dict[str, str]]]] = OrderedDict()
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self.hits = self.misses = 0
        if folder is not None:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(Path(folder) / "online-search.sqlite3"), check_same_thread=False, timeout=30)
            with self._db:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, at REAL, body TEXT)")

    def _fresh(self, at: float) -> bool:
        return self.ttl_s is None or time.time() - at < self.ttl_s

    def get(self, key: str) -> list[dict[str, str]] | None:
        with self._lock:
            found = self._memory.get(key)
            if found is not None and self._fresh(found[0]):
                self._memory.move_to_end(key)
                self.hits += 1
                return found[1]
            if self._db is not None:
                row = self._db.execute("SELECT at, body FROM answers WHERE key = ?", (key,)).fetchone()
                if row is not None and self._fresh(row[0]):
                    self._remember(key, row[0], json.loads(row[1]))
                    self.hits += 1
                    return list(json.loads(row[1]))
            self.misses += 1
            return None

    def put(self, key: str, value: list[dict[str, str]]) -> None:
        at = time.time()
        with self._lock:
            self._remember(key, at, value)
            if self._db is not None:
                with self._db:
                    self._db.execute("INSERT OR REPLACE INTO answers VALUES (?, ?, ?)", (key, at, json.dumps(value)))

    def _remember(self, key: str, at: float, value: list[dict[str, str]]) -> None:
        if self.size == 0:
            return
        self._memory[key] = (at, value)
        self._memory.move_to_end(key)
        while len(self._memory) > self.size:
            self._memory.popitem(last=False)


class OnlineSearch:
    """The shared machinery: cache, rate limit, retries, errors; subclasses ask the vendor and parse its JSON."""

    vendor: ClassVar[str]

    def __init__(self, config: OnlineConfig) -> None:
        self.config = config
        self.url = config.base_url or type(config).URL  # type: ignore[attr-defined]
        self.cache = ResponseCache(config.cache_size, config.cache_dir, config.cache_ttl_s)
        self.limiter = RateLimiter(config.max_qps)
        self._http = httpx.Client(
            timeout=config.timeout_s,
            limits=httpx.Limits(max_connections=config.max_concurrency),
        )
        self._pool = ThreadPoolExecutor(config.max_concurrency, thread_name_prefix=f"{self.vendor}-search")
        self.requests_sent = 0
        self._count_lock = threading.Lock()

    # --- what a vendor defines -------------------------------------------------------------------------------
    def _fetch(self, query: str, k: int) -> list[dict[str, str]]:
        """Passages (`doc_id`, `title`, `text`) for one query, best first, at least k when the vendor has them."""
        raise NotImplementedError

    def _cache_key(self, query: str, k: int) -> str:
        raise NotImplementedError

    def _vendor_message(self, response: httpx.Response) -> str:
        raise NotImplementedError

    # --- Retriever ---------------------------------------------------------------------------------------------
    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        asked = {q: (sanitize_query(q) if self.config.sanitize else q.strip()) for q in dict.fromkeys(queries)}
        found: dict[str, list[dict[str, str]]] = {}
        missing: list[str] = []
        for sent in dict.fromkeys(asked.values()):
            if not sent:
                found[sent] = []  # Search-R1 sends nothing for a blank query
                continue
            cached = self.cache.get(self._cache_key(sent, k))
            if cached is None:
                missing.append(sent)
            else:
                found[sent] = cached
        for sent, passages in zip(missing, self._pool.map(lambda q: self._fetch(q, k), missing), strict=True):
            self.cache.put(self._cache_key(sent, k), passages)
            found[sent] = passages
        return [
            [
                Hit(doc_id=p["doc_id"], score=1.0 / rank, text=p["text"], title=p["title"])
                for rank, p in enumerate(found[asked[q]][:k], start=1)
            ]
            for q in queries
        ]

    def _get(self, params: dict[str, Any]) -> dict[str, Any]:
        """GET the vendor with rate limiting and retries; the decoded JSON of a 200."""
        for attempt in range(self.config.retries + 1):
            last = attempt == self.config.retries
            response: httpx.Response | None = None
            self.limiter.acquire()
            try:
                with self._count_lock:
                    self.requests_sent += 1
                response = self._http.get(self.url, params=params)
            except httpx.TransportError as err:
                if last:
                    raise OnlineSearchError(
                        f"{self.vendor} at {self.url} unreachable after {attempt + 1} tries: {type(err).__name__}: "
                        f"{err}"
                    ) from err
            else:
                if response.status_code == 200:
                    try:
                        body = response.json()
                    except ValueError:
                        raise OnlineSearchError(
                            f"{self.vendor} answered 200 with a body that is not JSON: {response.text[:200]!r}"
                        ) from None
                    if not isinstance(body, dict):
                        raise OnlineSearchError(f"{self.vendor} answered 200 with JSON that is not an object")
                    return body
                if response.status_code not in RETRY_STATUS or last:
                    tries = f" after {attempt + 1} tries" if attempt else ""
                    raise OnlineSearchError(
                        f"{self.vendor} answered {response.status_code}{tries}: {self._vendor_message(response)}"
                    )
            time.sleep(self._pause(response, attempt))
        raise AssertionError("unreachable")

    def _pause(self, response: httpx.Response | None, attempt: int) -> float:
        wait = self.config.backoff_s * (2**attempt) * (0.5 + random.random())
        if response is not None:
            with contextlib.suppress(ValueError):
                asked = float(response.headers.get("retry-after", 0))
                if not math.isnan(asked):
                    wait = max(wait, min(asked, MAX_RETRY_AFTER_S))
        return wait

    def stats(self) -> dict[str, Any]:
        """For the server's /stats: requests sent to the vendor, cache hits and misses."""
        return {"requests_sent": self.requests_sent, "cache_hits": self.cache.hits, "cache_misses": self.cache.misses}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


class GoogleSearch(OnlineSearch):
    """Google Custom Search JSON API as a `Retriever` (Search-R1's `google_search_server.py --snippet_only`).

    Google answers at most 10 results a request; k > 10 asks for further pages (`start` 11, 21, ..., at most 100
    results, the API's limit). With `full_page`, Search-R1's default mode: each result's page is downloaded and
    its paragraphs holding the snippet's sentences are the passage (`pages.py`); results that are not HTML pages
    are left out, as Search-R1 does.
    """

    vendor = "Google Custom Search"

    def __init__(self, config: GoogleSearchConfig | None = None) -> None:
        config = config or GoogleSearchConfig()
        self.api_key = _env(config.api_key_env, "your Custom Search JSON API key")
        self.cse_id = _env(config.cse_id_env, "your Programmable Search Engine id (cx)")
        self.google = config
        super().__init__(config)
        self.pages: PageFetcher | None = None
        if config.full_page:
            self.pages = PageFetcher(config.page_timeout_s, config.max_page_bytes, config.page_concurrency)

    def _cache_key(self, query: str, k: int) -> str:
        mode = (self.google.snippet_filter, self.google.full_page)
        return _key("google", self.cse_id, *mode, query, math.ceil(min(k, 100) / 10))

    def stats(self) -> dict[str, Any]:
        """`OnlineSearch.stats`, and in full-page mode the page fetches (failures with their reason)."""
        return {**super().stats(), **(self.pages.stats.as_dict() if self.pages is not None else {})}

    def close(self) -> None:
        if self.pages is not None:
            self.pages.close()
        super().close()

    def _fetch(self, query: str, k: int) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        start = 1
        while len(out) < min(k, 100):
            body = self._get({"key": self.api_key, "cx": self.cse_id, "q": query, "num": 10, "start": start})
            items = body.get("items") or []
            if self.pages is not None:  # Search-R1's full-page mode: HTML results only, their pages' paragraphs
                links = html_links(items)
                texts = self.pages.texts(links)
                items = [{**item, "page": texts[item["link"]]} for item in items if item.get("link") in texts]
            for item in items:
                passage = self._passage(item)
                if passage is not None:
                    out.append(passage)
            next_page = (body.get("queries") or {}).get("nextPage")
            if not items or not next_page:
                break
            start = int(next_page[0].get("startIndex", start + 10))
            if start > 91:  # start + num may not pass 100
                break
        return out

    def _passage(self, item: dict[str, Any]) -> dict[str, str] | None:
        title = str(item.get("title") or "")
        snippet = str(item.get("snippet") or "")
        context = " ".join(parse_snippet(snippet)) if self.google.snippet_filter else snippet.strip()
        if item.get("page"):  # full-page mode: the page's paragraphs holding the snippet, else the snippet
            context = collect_context(snippet, item["page"]) or context
        if not title and not context:
            return None
        link = item.get("link")
        doc_id = str(link) if link else "google:" + hashlib.sha1(f"{title}\n{context}".encode()).hexdigest()[:16]
        return {"doc_id": doc_id, "title": title or "No title.", "text": context or "No snippet available."}

    def _vendor_message(self, response: httpx.Response) -> str:
        """Google's error body: `{"error": {"code", "message", "status", "errors": [...]}}`."""
        try:
            error = response.json().get("error")
        except (ValueError, AttributeError):
            return response.text[:300]
        if isinstance(error, dict):
            status = f" ({error['status']})" if error.get("status") else ""
            return f"{error.get('message', response.text[:300])}{status}"
        return str(error) if error else response.text[:300]


class SerpApiSearch(OnlineSearch):
    """SerpAPI as a `Retriever` (Search-R1's `serp_search_server.py`): the answer box first, then the organic
    results, then related questions; the first k of them.

    Search-R1's server returns the answer box, `topk` organic results and `topk` related questions (up to
    2*topk+1 passages whatever topk says); here a request gets at most its k.
    """

    vendor = "SerpAPI"

    def __init__(self, config: SerpApiSearchConfig | None = None) -> None:
        config = config or SerpApiSearchConfig()
        self.api_key = _env(config.api_key_env, "your SerpAPI key")
        self.serp = config
        super().__init__(config)

    def _cache_key(self, query: str, k: int) -> str:
        serp = self.serp
        return _key("serpapi", serp.engine, serp.answer_box, serp.related_questions, query, max(10, k))

    def _fetch(self, query: str, k: int) -> list[dict[str, str]]:
        params: dict[str, Any] = {"engine": self.serp.engine, "q": query, "api_key": self.api_key}
        if k > 10:
            params["num"] = k
        body = self._get(params)
        if (body.get("search_metadata") or {}).get("status") == "Error":
            raise OnlineSearchError(f"SerpAPI: {body.get('error', 'search failed (search_metadata.status Error)')}")
        # a 200 with an `error` but status Success is SerpAPI's "no results for this query": an empty answer
        out: list[dict[str, str]] = []
        box = body.get("answer_box")
        if self.serp.answer_box and isinstance(box, dict) and box:
            text = box.get("snippet") or box.get("answer") or " ".join(box.get("snippet_highlighted_words") or [])
            out.append(self._passage(box.get("title"), text, box.get("link"), "answer_box"))
        for result in body.get("organic_results") or []:
            out.append(self._passage(result.get("title"), result.get("snippet"), result.get("link"), "organic"))
        if self.serp.related_questions:
            for result in body.get("related_questions") or []:
                out.append(self._passage(result.get("question"), result.get("snippet"), result.get("link"), "related"))
        return out

    @staticmethod
    def _passage(title: Any, snippet: Any, link: Any, kind: str) -> dict[str, str]:
        title = str(title) if title else "No title."
        text = str(snippet) if snippet else "No snippet available."
        doc_id = str(link) if link else f"serpapi:{kind}:" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]
        return {"doc_id": doc_id, "title": title, "text": text}

    def _vendor_message(self, response: httpx.Response) -> str:
        """SerpAPI's error body: `{"error": "..."}`."""
        try:
            error = response.json().get("error")
        except (ValueError, AttributeError):
            return response.text[:300]
        return str(error) if error else response.text[:300]


ENGINES: dict[str, tuple[type[OnlineSearch], type[OnlineConfig]]] = {
    "google": (GoogleSearch, GoogleSearchConfig),
    "serpapi": (SerpApiSearch, SerpApiSearchConfig),
}


def online_backend(engine: str, **options: Any) -> OnlineSearch:
    """`google` or `serpapi` with its config's fields as options; errors are one line naming the option."""
    from pydantic import ValidationError

    if engine not in ENGINES:
        raise ValueError(f"unknown online engine {engine!r}; choose one of {', '.join(ENGINES)}")
    backend, config_class = ENGINES[engine]
    try:
        config = config_class(**options)
    except ValidationError as err:
        parts = []
        for e in err.errors(include_url=False):
            name = ".".join(str(p) for p in e["loc"])
            if e["type"] == "extra_forbidden":
                parts.append(f"unknown option {name!r}; valid options: {', '.join(config_class.model_fields)}")
            else:
                parts.append(f"option {name}={e.get('input')!r}: {e['msg']}")
        raise ValueError(f"{engine}: " + "; ".join(parts)) from None
    return backend(config)  # type: ignore[call-arg]
