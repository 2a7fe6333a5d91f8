"""Google Custom Search and SerpAPI backends against local stand-ins (127.0.0.1) that answer in the vendors'
documented JSON: Google's `customsearch/v1` (`items[].title/.snippet/.link`, `queries.nextPage`, errors as
`{"error": {"code", "message", "status"}}`) and SerpAPI's `/search` (`answer_box`, `organic_results[]`,
`related_questions[]`, `search_metadata.status`, errors as `{"error": "..."}`). The stand-ins are fixtures; the
backends, the cache, the rate limiter and the retries are the real code."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from rlloom.retrieval.cli import main
from rlloom.retrieval.online import (
    GoogleSearch,
    GoogleSearchConfig,
    MissingKeyError,
    OnlineSearchError,
    RateLimiter,
    SerpApiSearch,
    SerpApiSearchConfig,
    online_backend,
)
from rlloom.retrieval.server import ServerLimits

Answer = tuple[int, dict[str, Any], dict[str, str]]


class StandIn:
    """An HTTP server on 127.0.0.1 whose answers come from `respond(params) -> (status, json, headers)`."""

    def __init__(self, respond: Callable[[dict[str, str]], Answer]) -> None:
        self.requests: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                params = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
                outer.requests.append(params)
                status, body, headers = respond(params)
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/search"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def google_items(query: str, start: int, total: int = 23) -> dict[str, Any]:
    """A customsearch/v1 page: 10 items from `start`, `queries.nextPage` while more remain."""
    items = [
        {
            "kind": "customsearch#result",
            "title": f"{query} result {i}",
            "link": f"https://example.org/{query.replace(' ', '-')}/{i}",
            "snippet": f"Result {i} says a lot of things about {query} ... short bit ... and then more words about it",
        }
        for i in range(start, min(start + 10, total + 1))
    ]
    body: dict[str, Any] = {"kind": "customsearch#search", "queries": {"request": [{"startIndex": start}]}}
    if items:
        body["items"] = items
    if start + 10 <= total:
        body["queries"]["nextPage"] = [{"startIndex": start + 10}]
    return body


def google_ok(params: dict[str, str]) -> Answer:
    if params.get("key") != "test-key" or params.get("cx") != "test-cx":
        return 400, {"error": {"code": 400, "message": "API key not valid.", "status": "INVALID_ARGUMENT"}}, {}
    return 200, google_items(params["q"], int(params.get("start", "1"))), {}


@pytest.fixture
def google_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_API_KEY", "test-key")
    monkeypatch.setenv("GOOGLE_CSE_ID", "test-cx")


@pytest.fixture
def serp_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERPAPI_API_KEY", "serp-key")


def _google(url: str, **options: Any) -> GoogleSearch:
    return GoogleSearch(GoogleSearchConfig(base_url=url, max_qps=1000, backoff_s=0.01, **options))


def test_google_results_are_search_r1_passages(google_env: None) -> None:
    with StandIn(google_ok) as stand_in:
        google = _google(stand_in.url)
        hits = google.search(["who wrote the iliad?"], 3)[0]
    # Search-R1 sanitises the query and keeps the snippet's '...'-parts of more than 5 words
    assert stand_in.requests[0]["q"] == "who wrote the iliad"
    assert stand_in.requests[0]["key"] == "test-key" and stand_in.requests[0]["cx"] == "test-cx"
    assert [h.doc_id for h in hits] == [f"https://example.org/who-wrote-the-iliad/{i}" for i in (1, 2, 3)]
    assert hits[0].title == "who wrote the iliad result 1"
    assert hits[0].text == "Result 1 says a lot of things about who wrote the iliad and then more words about it"
    assert hits[0].contents == f'"{hits[0].title}"\n{hits[0].text}'
    assert [h.score for h in hits] == [1.0, 0.5, pytest.approx(1 / 3)]


def test_google_pages_past_ten_results(google_env: None) -> None:
    with StandIn(google_ok) as stand_in:
        hits = _google(stand_in.url).search(["iliad"], 15)[0]
    assert len(hits) == 15 and hits[-1].doc_id.endswith("/15")
    assert [r.get("start") for r in stand_in.requests] == ["1", "11"]


def test_answers_are_cached_in_memory_and_on_disk(google_env: None, tmp_path: Path) -> None:
    with StandIn(google_ok) as stand_in:
        google = _google(stand_in.url, cache_dir=str(tmp_path))
        first = google.search(["iliad", "odyssey", "iliad", "  "], 3)
        assert len(stand_in.requests) == 2  # a repeated query is asked once, a blank one not at all
        assert first[0] == first[2] and first[3] == []
        assert google.search(["odyssey", "iliad"], 2) == [first[1][:2], first[0][:2]]
        assert len(stand_in.requests) == 2 and google.cache.hits == 2
        again = _google(stand_in.url, cache_dir=str(tmp_path))  # a new process, say: the SQLite file answers
        assert again.search(["iliad"], 3) == [first[0]]
        assert len(stand_in.requests) == 2
        expired = _google(stand_in.url, cache_dir=str(tmp_path), cache_ttl_s=1e-9)
        expired.search(["iliad"], 3)
        assert len(stand_in.requests) == 3


def test_a_missing_key_names_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.setenv("GOOGLE_CSE_ID", "cx")
    with pytest.raises(MissingKeyError, match="GOOGLE_API_KEY is not set"):
        GoogleSearch()
    monkeypatch.setenv("GOOGLE_API_KEY", "k")
    monkeypatch.delenv("GOOGLE_CSE_ID")
    with pytest.raises(MissingKeyError, match="GOOGLE_CSE_ID"):
        GoogleSearch()
    monkeypatch.delenv("SERPAPI_API_KEY", raising=False)
    with pytest.raises(MissingKeyError, match="SERPAPI_API_KEY"):
        online_backend("serpapi")
    with pytest.raises(ValueError, match="unknown option 'qps'; valid options: .*max_qps"):
        online_backend("google", qps=3)


def test_vendor_errors_surface_their_message_without_retrying(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_API_KEY", "wrong")
    monkeypatch.setenv("GOOGLE_CSE_ID", "test-cx")
    with StandIn(google_ok) as stand_in:
        with pytest.raises(OnlineSearchError, match=r"answered 400: API key not valid\. \(INVALID_ARGUMENT\)"):
            _google(stand_in.url).search(["iliad"], 3)
        assert len(stand_in.requests) == 1  # a bad key does not get better by asking again


def test_busy_answers_are_retried_with_backoff_then_reported(google_env: None) -> None:
    calls = {"n": 0}

    def flaky(params: dict[str, str]) -> Answer:
        calls["n"] += 1
        if calls["n"] <= 2:
            return 503, {"error": {"code": 503, "message": "Backend Error", "status": "UNAVAILABLE"}}, {}
        return google_ok(params)

    with StandIn(flaky) as stand_in:
        assert len(_google(stand_in.url).search(["iliad"], 3)[0]) == 3
        assert len(stand_in.requests) == 3

    def quota(params: dict[str, str]) -> Answer:
        message = "Quota exceeded for quota metric 'Queries' and limit 'Queries per day'"
        return 429, {"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED"}}, {"Retry-After": "0"}

    with StandIn(quota) as stand_in:
        with pytest.raises(OnlineSearchError, match="answered 429 after 3 tries: Quota exceeded"):
            _google(stand_in.url, retries=2).search(["iliad"], 3)
        assert len(stand_in.requests) == 3
    with pytest.raises(OnlineSearchError, match="unreachable after 2 tries"):
        _google("http://127.0.0.1:9/search", retries=1, timeout_s=2).search(["iliad"], 3)


def test_requests_are_spaced_to_max_qps(google_env: None) -> None:
    with StandIn(google_ok) as stand_in:
        google = GoogleSearch(GoogleSearchConfig(base_url=stand_in.url, max_qps=20, max_concurrency=4))
        started = time.monotonic()
        google.search([f"query {i}" for i in range(6)], 3)
        assert time.monotonic() - started >= 5 / 20 - 0.01  # 6 requests, 1/20 s apart
    clock = [0.0]
    limiter = RateLimiter(2.0, clock=lambda: clock[0])
    slots = []
    for _ in range(3):
        before = time.monotonic()
        limiter.acquire()
        slots.append(time.monotonic() - before)
        clock[0] += 0.5  # the caller's own time passes: no wait needed
    assert max(slots) < 0.05


def serp_ok(params: dict[str, str]) -> Answer:
    if params.get("api_key") != "serp-key":
        return 401, {"error": "Invalid API key. Your API key should be here: https://serpapi.com/manage-api-key"}, {}
    query = params["q"]
    if query == "nothing at all":
        return 200, {"search_metadata": {"status": "Success"}, "error": "Google hasn't returned any results."}, {}
    if query == "broken":
        return 200, {"search_metadata": {"status": "Error"}, "error": "Google hasn't returned a valid page."}, {}
    return (
        200,
        {
            "search_metadata": {"status": "Success"},
            "answer_box": {
                "type": "organic_result",
                "title": "Iliad",
                "snippet": "Homer wrote it.",
                "link": "https://a.org",
            },
            "organic_results": [
                {
                    "position": i,
                    "title": f"Organic {i}",
                    "link": f"https://o.org/{i}",
                    "snippet": f"organic snippet {i}",
                }
                for i in range(1, 6)
            ],
            "related_questions": [{"question": "Who was Homer?", "snippet": "A poet."}],
        },
        {},
    )


def test_serpapi_answer_box_organic_then_related(serp_env: None) -> None:
    with StandIn(serp_ok) as stand_in:
        serp = SerpApiSearch(SerpApiSearchConfig(base_url=stand_in.url, max_qps=1000))
        top3, everything = serp.search(["who wrote the iliad?"], 3)[0], serp.search(["who wrote the iliad?"], 10)[0]
    assert stand_in.requests[0] == {"engine": "google", "q": "who wrote the iliad?", "api_key": "serp-key"}
    assert [h.contents for h in top3] == ['"Iliad"\nHomer wrote it.', '"Organic 1"\norganic snippet 1',
                                          '"Organic 2"\norganic snippet 2']  # fmt: skip
    assert [h.doc_id for h in top3] == ["https://a.org", "https://o.org/1", "https://o.org/2"]
    assert len(everything) == 7 and everything[-1].title == "Who was Homer?"
    assert everything[-1].doc_id.startswith("serpapi:related:")
    assert len(stand_in.requests) == 1  # both k fit one request's results (cached under k <= 10)


def test_serpapi_no_results_is_empty_and_errors_carry_the_message(
    serp_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with StandIn(serp_ok) as stand_in:
        serp = SerpApiSearch(SerpApiSearchConfig(base_url=stand_in.url, max_qps=1000))
        assert serp.search(["nothing at all"], 3) == [[]]
        with pytest.raises(OnlineSearchError, match="SerpAPI: Google hasn't returned a valid page"):
            serp.search(["broken"], 3)
        monkeypatch.setenv("SERPAPI_API_KEY", "wrong")
        with pytest.raises(OnlineSearchError, match="SerpAPI answered 401: Invalid API key"):
            SerpApiSearch(SerpApiSearchConfig(base_url=stand_in.url)).search(["iliad"], 3)


@pytest.fixture
def google_stand_in(google_env: None) -> Iterator[StandIn]:
    with StandIn(google_ok) as stand_in:
        yield stand_in


def test_served_with_search_r1s_api(google_stand_in: StandIn, start_server: Any) -> None:
    """What Search-R1's trainer posts to its google_search_server, answered by rlloom's server."""
    google = _google(google_stand_in.url)
    with start_server(google, ServerLimits(freeze_gc=False)) as server:
        payload = {"queries": ["iliad", "odyssey"], "topk": 3, "return_scores": True}
        body = httpx.post(f"{server.url}/retrieve", json=payload).json()
        assert len(body["result"]) == 2 and all(len(r) == 3 for r in body["result"])
        assert body["result"][1][0]["document"]["contents"].startswith('"odyssey result 1"\n')
        single = httpx.post(f"{server.url}/retrieve", json={"queries": ["x"], "topk": 3})
        assert single.status_code == 200 and len(single.json()["result"][0]) == 3
    bad = _google("http://127.0.0.1:9/search", retries=0, timeout_s=2)
    with start_server(bad, ServerLimits(freeze_gc=False)) as server:
        failed = httpx.post(f"{server.url}/retrieve", json={"queries": ["iliad"], "topk": 3})
    assert failed.status_code == 500 and "Google Custom Search at http://127.0.0.1:9" in failed.json()["detail"]


def test_serve_online_without_a_key_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SERPAPI_API_KEY", raising=False)
    assert main(["serve", "--online", "serpapi", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "SERPAPI_API_KEY is not set" in err
