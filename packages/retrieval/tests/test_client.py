import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlloom.retrieval.client import AsyncRetrievalClient, RetrievalClient, RetrievalError
from rlloom.retrieval.index import IndexRetriever
from rlloom.retrieval.server import ServerLimits
from rlloom.retrieval.types import Hit, Retriever


def _queries(hotpot: Path) -> list[str]:
    return [json.loads(line)["text"] for line in (hotpot / "queries.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("api", ["native", "search-r1"])
def test_sync_client_is_indistinguishable_from_the_local_index(
    live_server: Any, hotpot_bm25: IndexRetriever, hotpot: Path, api: str
) -> None:
    queries = _queries(hotpot)
    with RetrievalClient(live_server.url, api=api) as client:  # type: ignore[arg-type]
        assert isinstance(client, Retriever)
        remote = client.search(queries, 5)
    local = hotpot_bm25.search(queries, 5)
    for got, want in zip(remote, local, strict=True):
        assert [(h.doc_id, h.title, h.text) for h in got] == [(h.doc_id, h.title, h.text) for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want])


def test_async_client_runs_many_requests_concurrently(
    live_server: Any, hotpot_bm25: IndexRetriever, hotpot: Path
) -> None:
    queries = _queries(hotpot)

    async def main() -> list[list[str]]:
        async with AsyncRetrievalClient(live_server.url) as client:
            answers = await asyncio.gather(*(client.search([q], 3) for q in queries * 8))
        return [[h.doc_id for h in a[0]] for a in answers]

    expected = [[h.doc_id for h in hits] for hits in hotpot_bm25.search(queries * 8, 3)]
    assert asyncio.run(main()) == expected


def test_client_reports_a_rejected_request_without_retrying(live_server: Any) -> None:
    with (
        RetrievalClient(live_server.url, retries=3) as client,
        pytest.raises(RetrievalError, match=r"422: .*between 1 and 20"),
    ):
        client.search(["q"], 1000)


def test_unreachable_server_fails_after_retries() -> None:
    client = RetrievalClient("http://127.0.0.1:9", retries=2, backoff=0.01, timeout=1)
    with client, pytest.raises(RetrievalError, match="unreachable after 3 tries"):
        client.search(["q"], 1)

    async def main() -> None:
        async with AsyncRetrievalClient("http://127.0.0.1:9", retries=1, backoff=0.01, timeout=1) as client:
            await client.search(["q"], 1)

    with pytest.raises(RetrievalError, match="unreachable after 2 tries"):
        asyncio.run(main())


def test_client_retries_a_full_queue_until_it_drains(start_server: Any, hotpot_bm25: IndexRetriever) -> None:
    """A 503 (queue full) is retried with backoff; once the backend drains, the same call succeeds."""
    release = threading.Event()

    class Slow:
        def search(self, queries: list[str], k: int) -> list[list[Hit]]:
            release.wait(timeout=10)
            return hotpot_bm25.search(queries, k)

    limits = ServerLimits(max_pending_queries=2, batch_window_ms=0, freeze_gc=False)
    with start_server(Slow(), limits) as server, RetrievalClient(server.url, retries=6, backoff=0.05) as client:
        blocker = threading.Thread(
            target=httpx.post,
            args=(f"{server.url}/search",),
            kwargs={"json": {"queries": ["a", "b"], "k": 1}, "timeout": 20},
        )
        blocker.start()
        for _ in range(200):  # the two blocking queries fill the queue
            if httpx.get(f"{server.url}/stats").json()["pending_queries"] == 2:
                break
            threading.Event().wait(0.01)
        threading.Timer(0.3, release.set).start()
        hits = client.search(["film"], 2)
        blocker.join(timeout=20)
        stats = httpx.get(f"{server.url}/stats").json()
    assert [h.doc_id for h in hits[0]] == [h.doc_id for h in hotpot_bm25.search(["film"], 2)[0]]
    assert stats["rejected_503"] >= 1  # the client really met a full queue before it succeeded


@pytest.mark.slow
def test_thousands_of_concurrent_async_calls_all_succeed(live_server: Any, hotpot_bm25: IndexRetriever) -> None:
    """A rollout batch may fire thousands of searches at once; they queue in the client, one per connection.

    Left to httpx's pool (before the client's semaphore), 3,000 concurrent calls all failed with PoolTimeout after
    minutes, while the server had answered only a few hundred requests.
    """
    queries = [f"film {i}" for i in range(3000)]

    async def main() -> list[list[list[Hit]]]:
        async with AsyncRetrievalClient(live_server.url, timeout=20, retries=0) as client:
            return await asyncio.gather(*(client.search([q], 2) for q in queries))

    answers = asyncio.run(main())
    expected = hotpot_bm25.search(queries, 2)
    assert [[h.doc_id for h in a[0]] for a in answers] == [[h.doc_id for h in hits] for hits in expected]


@pytest.mark.parametrize(
    ("option", "field"),
    [({"retries": -1}, "retries"), ({"backoff": -0.1}, "backoff"), ({"max_connections": 0}, "max_connections")],
)
def test_bad_client_settings_are_refused_naming_the_field(option: dict[str, Any], field: str) -> None:
    # retries=-1 used to make no request and raise a bare AssertionError("unreachable") on the first search
    for cls in (RetrievalClient, AsyncRetrievalClient):
        with pytest.raises(ValueError, match=f"^{field} must be"):
            cls("http://127.0.0.1:9", **option)


def test_a_200_that_is_not_a_retrieval_response_is_a_retrieval_error() -> None:
    from rlloom.retrieval.client import _results

    request = httpx.Request("POST", "http://proxy.local/search")
    page = httpx.Response(200, text="<html>login required</html>", request=request)
    with pytest.raises(RetrievalError, match=r"not a native retrieval response .*'<html>login required"):
        _results("native", page, 1)
    wrong_shape = httpx.Response(200, json={"hits": []}, request=request)
    with pytest.raises(RetrievalError, match=r"KeyError: 'results'"):
        _results("native", wrong_shape, 1)


def test_retry_after_stretches_the_pause_before_the_next_try() -> None:
    from rlloom.retrieval.client import _pause

    busy = httpx.Response(503, headers={"Retry-After": "2"})
    assert _pause(busy, 0, 0.1) == 2.0  # the backoff (0.05-0.15 s) is shorter than what the server asked
    assert 0.05 <= _pause(httpx.Response(503, headers={"Retry-After": "soon"}), 0, 0.1) <= 0.15  # junk: backoff
    assert 0.05 <= _pause(None, 0, 0.1) <= 0.15  # a transport error has no response
    assert _pause(httpx.Response(503, headers={"Retry-After": "0.01"}), 3, 0.1) >= 0.4  # backoff 0.8 x [0.5, 1.5)
    # a server asking for forever (or for more than a minute) gets at most a minute; 'nan' is junk
    assert _pause(httpx.Response(503, headers={"Retry-After": "inf"}), 0, 0.1) == 60.0
    assert _pause(httpx.Response(503, headers={"Retry-After": "86400"}), 0, 0.1) == 60.0
    assert 0.05 <= _pause(httpx.Response(503, headers={"Retry-After": "nan"}), 0, 0.1) <= 0.15
