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


def _lucene_style(contents: str, score: float) -> dict[str, Any]:
    """An item as Search-R1's BM25 server returns it (retrieval_server.py, BM25Retriever._search with stored
    docs): `title`, `text` and `contents`, no `id`."""
    title = contents.split("\n", maxsplit=1)[0].strip('"')
    return {
        "document": {"title": title, "text": "\n".join(contents.split("\n")[1:]), "contents": contents},
        "score": score,
    }


def test_search_r1_documents_without_an_id_are_read() -> None:
    """Search-R1's Lucene server sends no `id`; that used to be a RetrievalError, shown to the model as a failed
    search while training went on."""
    first, second = '"Iliad"\nAn epic poem by Homer.', '"Odyssey"\nThe sequel.\nIn 24 books.'
    body = {"result": [[_lucene_style(first, 9.5), _lucene_style(second, 7.25)], []]}
    seen: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=body)

    with RetrievalClient("http://search-r1.local", api="search-r1") as client:
        client._http = httpx.Client(base_url="http://search-r1.local", transport=httpx.MockTransport(answer))
        hits, empty = client.search(["who wrote the iliad", "nothing"], 2)
    assert seen == [{"queries": ["who wrote the iliad", "nothing"], "topk": 2, "return_scores": True}]
    assert empty == []
    assert [(h.title, h.text, h.score) for h in hits] == [
        ("Iliad", "An epic poem by Homer.", 9.5),
        ("Odyssey", "The sequel.\nIn 24 books.", 7.25),
    ]
    assert [h.contents for h in hits] == [first, second]  # the agent shows the model exactly Search-R1's text
    ids = [h.doc_id for h in hits]
    assert ids[0] != ids[1] and all(i.startswith("contents:") for i in ids)
    assert [h.doc_id for h in _search_r1_once(body)] == ids  # stable: the same passage gets the same id on every call


def _search_r1_once(body: dict[str, Any]) -> list[Hit]:
    from rlloom.retrieval.client import _results

    request = httpx.Request("POST", "http://search-r1.local/retrieve")
    return _results("search-r1", httpx.Response(200, json=body, request=request), 2)[0]


def test_search_r1_documents_with_title_and_text_only_are_read() -> None:
    from rlloom.retrieval.client import _results

    request = httpx.Request("POST", "http://search-r1.local/retrieve")
    body = {"result": [[{"title": "Iliad", "text": "An epic poem."}, {"id": "7", "contents": "plain text"}]]}
    [hits] = _results("search-r1", httpx.Response(200, json=body, request=request), 1)
    assert [(h.title, h.text, h.contents) for h in hits] == [
        ("Iliad", "An epic poem.", '"Iliad"\nAn epic poem.'),
        (None, "plain text", "plain text"),
    ]
    assert hits[1].doc_id == "7"
