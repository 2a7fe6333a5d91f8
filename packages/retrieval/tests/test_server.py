import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlloom.retrieval.index import IndexRetriever
from rlloom.retrieval.server import ServerLimits
from rlloom.retrieval.types import Hit


def _queries(hotpot: Path) -> list[str]:
    return [json.loads(line)["text"] for line in (hotpot / "queries.jsonl").read_text().splitlines()]


def test_retrieve_is_search_r1_wire_compatible(live_server: Any, hotpot_bm25: IndexRetriever, hotpot: Path) -> None:
    queries = _queries(hotpot)[:2]
    expected = hotpot_bm25.search(queries, 3)
    body = httpx.post(f"{live_server.url}/retrieve", json={"queries": queries, "topk": 3, "return_scores": True}).json()
    assert set(body) == {"result"} and len(body["result"]) == 2
    for hits, want in zip(body["result"], expected, strict=True):
        assert [set(h) for h in hits] == [{"document", "score"}] * 3
        assert [h["document"]["id"] for h in hits] == [w.doc_id for w in want]
        assert [h["document"]["contents"] for h in hits] == [f'"{w.title}"\n{w.text}' for w in want]
        assert [h["score"] for h in hits] == pytest.approx([w.score for w in want])
    bare = httpx.post(f"{live_server.url}/retrieve", json={"queries": queries, "topk": 3}).json()["result"]
    assert bare == [[h["document"] for h in hits] for hits in body["result"]]


def test_retrieve_defaults_topk_like_search_r1(live_server: Any, hotpot: Path) -> None:
    body = httpx.post(f"{live_server.url}/retrieve", json={"queries": _queries(hotpot)[:1], "topk": None}).json()
    assert len(body["result"][0]) == 3


def test_native_search_and_health(live_server: Any, hotpot_bm25: IndexRetriever, hotpot: Path) -> None:
    queries = _queries(hotpot)
    body = httpx.post(f"{live_server.url}/search", json={"queries": queries, "k": 5}).json()
    assert [[Hit.model_validate(h) for h in hits] for hits in body["results"]] == hotpot_bm25.search(queries, 5)
    assert httpx.get(f"{live_server.url}/health").json() == {"status": "ok", "backend": "test"}


@pytest.mark.parametrize(
    ("path", "payload", "field"),
    [
        ("/retrieve", {"queries": ["q"] * 9, "topk": 3}, "queries"),
        ("/retrieve", {"queries": ["q"], "topk": 21}, "topk"),
        ("/retrieve", {"queries": ["q"], "topk": -1}, "topk"),
        ("/retrieve", {"queries": ["q"], "topk": 2.5}, "topk"),
        ("/search", {"queries": ["q"], "k": -1}, "k"),
        ("/search", {"queries": ["q"], "k": 0}, "k"),
        ("/retrieve", {"queries": ["q", 7], "topk": 3}, "queries.1"),
        ("/retrieve", {"topk": 3}, "queries"),
        ("/retrieve", {"queries": [1, 2], "topk": 3}, "queries"),
        ("/retrieve", {"queries": "one string", "topk": 3}, "queries"),
        ("/retrieve", {"queries": ["q"], "topk": "three"}, "topk"),
    ],
)
def test_bad_requests_get_422_naming_the_field(live_server: Any, path: str, payload: dict, field: str) -> None:
    response = httpx.post(f"{live_server.url}{path}", json=payload)
    assert response.status_code == 422
    locs = [".".join(str(p) for p in d["loc"]) for d in response.json()["detail"]]
    assert any(loc == f"body.{field}" or loc.startswith(f"body.{field}.") for loc in locs), locs


@pytest.mark.parametrize(
    ("path", "payload", "loc", "msg"),
    [
        ("/search", {"queries": ["q"], "kk": 3}, "kk", "unknown field 'kk'; the body takes queries, k"),
        ("/search", {"queries": ["q"], "topk": 2}, "topk", "unknown field 'topk'; this route calls it 'k'"),
        ("/search", {"queries": ["q"], "k": True}, "k", "valid integer"),
        ("/search", {"queries": ["q"], "k": "3"}, "k", "valid integer"),
    ],
)
def test_native_search_refuses_unknown_fields_and_non_integers(
    live_server: Any, path: str, payload: dict, loc: str, msg: str
) -> None:
    response = httpx.post(f"{live_server.url}{path}", json=payload)
    assert response.status_code == 422
    (detail,) = response.json()["detail"]
    assert detail["loc"] == ["body", loc] and msg in detail["msg"]


def _top_ids(hotpot_bm25: IndexRetriever, query: str, k: int) -> list[str]:
    return [h.doc_id for h in hotpot_bm25.search([query], k)[0]]


@pytest.mark.parametrize(
    ("extra", "k"),
    [
        ({"topk": None}, 3),
        ({"topk": 0}, 3),  # Search-R1: `if not request.topk: request.topk = config.retrieval_topk`
        ({}, 3),
        ({"topk": "2"}, 2),  # pydantic's lax int, as Search-R1's plain model reads it
        ({"topk": 2.0}, 2),
        ({"topk": 5, "tpok": 1, "session": "abc"}, 5),  # unknown fields are ignored there
        ({"topk": 4, "return_scores": "true"}, 4),
    ],
)
def test_retrieve_reads_bodies_as_search_r1_does(
    live_server: Any, hotpot_bm25: IndexRetriever, hotpot: Path, extra: dict[str, Any], k: int
) -> None:
    query = _queries(hotpot)[1]
    response = httpx.post(f"{live_server.url}/retrieve", json={"queries": [query], **extra})
    assert response.status_code == 200, response.text
    [hits] = response.json()["result"]
    ids = [h["document"]["id"] if "document" in h else h["id"] for h in hits]
    assert ids == _top_ids(hotpot_bm25, query, k) and len(ids) == k
    assert ("document" in hits[0]) == (extra.get("return_scores") == "true")


def test_an_empty_batch_answers_an_empty_result(live_server: Any) -> None:
    """Search-R1's trainer posts `{"queries": []}` on turns where no conversation searched, then reads
    `["result"]` (search_r1/llm_agent/generation.py: batch_search), so the empty batch is an answer, not a 422."""
    before = httpx.get(f"{live_server.url}/stats").json()
    retrieve = httpx.post(f"{live_server.url}/retrieve", json={"queries": [], "topk": 3, "return_scores": True})
    assert (retrieve.status_code, retrieve.json()) == (200, {"result": []})
    search = httpx.post(f"{live_server.url}/search", json={"queries": [], "k": 3})
    assert (search.status_code, search.json()) == (200, {"results": []})
    stats = httpx.get(f"{live_server.url}/stats").json()
    assert stats["batches"] == before["batches"]  # nothing reached the backend


def test_a_too_long_query_is_cut_and_reported_not_refused(live_server: Any, hotpot_bm25: IndexRetriever) -> None:
    """One over-long query used to fail the whole batch with 422 (and Search-R1's trainer with KeyError)."""
    long = "film " * 60  # 300 characters, the limit here is 200
    body = httpx.post(f"{live_server.url}/search", json={"queries": ["q", long], "k": 3}).json()
    assert body["truncated_queries"] == [{"index": 1, "chars": 300, "limit": "200 characters"}]
    assert body["results"][1] == [h.model_dump() for h in hotpot_bm25.search([long[:200]], 3)[0]]
    wrong_type = httpx.post(f"{live_server.url}/search", json={"queries": ["q", 7], "k": 3}).json()
    assert wrong_type["detail"][0]["loc"] == ["body", "queries", 1]


def test_search_r1_client_payload_is_accepted(live_server: Any, hotpot: Path) -> None:
    """Search-R1's generation.py `_batch_search` posts exactly these three fields."""
    payload = {"queries": _queries(hotpot)[:2], "topk": 3, "return_scores": True}
    response = httpx.post(f"{live_server.url}/retrieve", json=payload)
    assert response.status_code == 200 and [len(r) for r in response.json()["result"]] == [3, 3]


def test_malformed_json_gets_422_and_the_server_lives_on(live_server: Any, hotpot: Path) -> None:
    response = httpx.post(
        f"{live_server.url}/retrieve", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert httpx.post(f"{live_server.url}/search", json={"queries": _queries(hotpot)[:1], "k": 1}).status_code == 200


def test_concurrent_clients_get_their_own_answers(live_server: Any, hotpot_bm25: IndexRetriever, hotpot: Path) -> None:
    queries = _queries(hotpot)
    expected = {q: [h.doc_id for h in hits] for q, hits in zip(queries, hotpot_bm25.search(queries, 4), strict=True)}
    before = httpx.get(f"{live_server.url}/stats").json()

    def client(i: int) -> list[bool]:
        with httpx.Client(base_url=live_server.url) as http:
            out = []
            for j in range(10):
                query = queries[(i + j) % len(queries)]
                hits = http.post("/search", json={"queries": [query], "k": 4}).json()["results"][0]
                out.append([h["doc_id"] for h in hits] == expected[query])
            return out

    with ThreadPoolExecutor(16) as pool:
        results = [ok for part in pool.map(client, range(16)) for ok in part]
    assert len(results) == 160 and all(results)
    stats = httpx.get(f"{live_server.url}/stats").json()
    assert stats["requests"] - before["requests"] == 160
    assert stats["batches"] - before["batches"] <= 160  # gathering never makes more calls than requests
    assert stats["latency_ms"]["p50"] is not None and stats["latency_ms"]["p99"] >= stats["latency_ms"]["p50"]


class _Gate:
    """A real index whose search waits on an event, so a queue can be filled deterministically."""

    def __init__(self, inner: IndexRetriever) -> None:
        self.inner, self.release = inner, threading.Event()

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.release.wait(timeout=10)
        if "poison" in queries:
            raise RuntimeError("backend exploded")
        return self.inner.search(queries, k)


def test_overload_answers_503_fast_and_backend_errors_500(start_server: Any, hotpot_bm25: IndexRetriever) -> None:
    gate = _Gate(hotpot_bm25)
    limits = ServerLimits(max_pending_queries=4, batch_window_ms=0)
    with start_server(gate, limits) as server, ThreadPoolExecutor(2) as pool:
        blocked = pool.submit(httpx.post, f"{server.url}/search", json={"queries": ["a", "b", "c"], "k": 1}, timeout=20)
        # wait until the 3 queries are queued, then 2 more exceed the limit of 4
        for _ in range(200):
            if httpx.get(f"{server.url}/stats").json()["pending_queries"] == 3:
                break
            threading.Event().wait(0.01)
        over = httpx.post(f"{server.url}/search", json={"queries": ["d", "e"], "k": 1}, timeout=5)
        assert over.status_code == 503 and "retry later" in over.json()["detail"]
        gate.release.set()
        assert blocked.result().status_code == 200
        failed = httpx.post(f"{server.url}/search", json={"queries": ["poison"], "k": 1})
        assert failed.status_code == 500 and "backend exploded" in failed.json()["detail"]
        assert httpx.post(f"{server.url}/search", json={"queries": ["film"], "k": 1}).status_code == 200
        stats = httpx.get(f"{server.url}/stats").json()
        assert (stats["rejected_503"], stats["errors_500"]) == (1, 1)


def test_body_sent_in_chunks_is_read_whole(live_server: Any, hotpot_bm25: IndexRetriever, hotpot: Path) -> None:
    query = _queries(hotpot)[0]
    raw = json.dumps({"queries": [query], "k": 2}).encode()
    # a generator body goes out with chunked transfer encoding: the server sees several ASGI body messages
    chunks = iter([raw[:7], raw[7:20], raw[20:]])
    response = httpx.post(f"{live_server.url}/search", content=chunks, headers={"content-type": "application/json"})
    assert response.status_code == 200
    assert [h["doc_id"] for h in response.json()["results"][0]] == [h.doc_id for h in hotpot_bm25.search([query], 2)[0]]


def test_an_oversized_body_gets_413_without_being_read_whole(start_server: Any, hotpot_bm25: IndexRetriever) -> None:
    assert ServerLimits().body_limit() == 64 * 1024 * 1024  # 2,560 queries of 4,096 characters fit 6 times over
    small = ServerLimits(max_body_bytes=2_000)
    with start_server(hotpot_bm25, small) as server:
        big = {"queries": ["film " * 100] * 10, "k": 1}  # about 5 kB
        declared = httpx.post(f"{server.url}/search", json=big)
        assert declared.status_code == 413 and "exceeds 2000 bytes" in declared.json()["detail"]
        raw = json.dumps(big).encode()

        def chunks() -> Iterator[bytes]:  # chunked transfer: no declared length, so the server counts bytes
            for i in range(0, len(raw), 500):
                yield raw[i : i + 500]

        chunked = httpx.post(f"{server.url}/retrieve", content=chunks(), headers={"content-type": "application/json"})
        assert chunked.status_code == 413
        assert httpx.post(f"{server.url}/search", json={"queries": ["film"], "k": 1}).status_code == 200
        assert httpx.get(f"{server.url}/stats").json()["too_large_413"] == 2


def test_openapi_still_documents_the_query_bodies(live_server: Any) -> None:
    spec = httpx.get(f"{live_server.url}/openapi.json").json()
    retrieve = spec["paths"]["/retrieve"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    search = spec["paths"]["/search"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(retrieve["properties"]) == {"queries", "topk", "return_scores"}
    assert set(search["properties"]) == {"queries", "k"}


def _schema(spec: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    ref = response["content"]["application/json"]["schema"]["$ref"]
    return dict(spec["components"]["schemas"][ref.rsplit("/", 1)[-1]])


def test_openapi_documents_the_422_and_the_other_errors(live_server: Any) -> None:
    """The routes parse their own bodies, so FastAPI does not add the 422 by itself: it must be declared, in the
    shape the server really sends."""
    from rlloom.retrieval.wire import ValidationErrorBody

    spec = httpx.get(f"{live_server.url}/openapi.json").json()
    for path in ("/retrieve", "/search"):
        responses = spec["paths"][path]["post"]["responses"]
        assert {"200", "408", "413", "422", "500", "503"} <= set(responses)
        invalid = _schema(spec, responses["422"])
        assert set(invalid["properties"]) == {"detail"}
        item = spec["components"]["schemas"][invalid["properties"]["detail"]["items"]["$ref"].rsplit("/", 1)[-1]]
        assert set(item["properties"]) == {"loc", "msg", "type"}
        assert set(_schema(spec, responses["413"])["properties"]) == {"detail"}
    assert "result" in _schema(spec, spec["paths"]["/retrieve"]["post"]["responses"]["200"])["properties"]
    real = httpx.post(f"{live_server.url}/search", json={"queries": ["q"], "k": 0}).json()
    ValidationErrorBody.model_validate(real)  # what is documented is what comes back


def _children(pid: int) -> set[int]:
    return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads worker processes from Linux /proc")
def test_serve_with_two_workers_answers_from_both_processes(tmp_path: Path, hotpot: Path) -> None:
    """`serve --workers 2`: two uvicorn worker processes, each loading the index itself, answer on one port."""
    from rlloom.retrieval.index import build_index, load_index

    index = build_index(hotpot / "corpus.jsonl", tmp_path / "bm25")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    cmd = [sys.executable, "-m", "rlloom.retrieval.cli", "serve", "--index", str(index), "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--workers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while len(_children(proc.pid)) < 2 or not _answers(url):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "two workers did not come up in 120 s"
            time.sleep(0.2)
        query = _queries(hotpot)[0]
        expected = [h.doc_id for h in load_index(index).search([query], 3)[0]]
        pids = set()
        for _ in range(60):  # fresh connections: the kernel hands them to either worker
            with httpx.Client(base_url=url) as http:
                assert [d["id"] for d in http.post("/retrieve", json={"queries": [query]}).json()["result"][0]] == (
                    expected
                )
                pids.add(http.get("/stats").json()["pid"])
        assert pids <= _children(proc.pid) and len(pids) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
