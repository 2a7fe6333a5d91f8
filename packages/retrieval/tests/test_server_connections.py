"""Slow and stuck clients over raw sockets: stalled bodies, half-sent heads, idle keep-alives and the connection cap.

Each test opens a bounded number of sockets on 127.0.0.1 and runs with timeouts of a second or less
(`ServerLimits.body_timeout_s`, `idle_timeout_s`), so a stuck socket shows up as "still open long after its
deadline" within a few seconds.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from rlloom.retrieval.index import IndexRetriever
from rlloom.retrieval.server import ServerLimits

HEAD = b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"


@contextmanager
def _sockets(port: int, count: int, payload: bytes) -> Iterator[list[socket.socket]]:
    """`count` connections that each send `payload` and then nothing more; all closed on exit."""
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            if payload:
                sock.sendall(payload)
            opened.append(sock)
        yield opened
    finally:
        for sock in opened:
            sock.close()


def _until_closed(socks: list[socket.socket], deadline_s: float) -> dict[socket.socket, bytes]:
    """What each socket received until the server closed it; the sockets still open at the deadline are left out."""
    received = dict.fromkeys(socks, b"")
    closed: dict[socket.socket, bytes] = {}
    end = time.monotonic() + deadline_s
    while len(closed) < len(socks) and (left := end - time.monotonic()) > 0:
        ready, _, _ = select.select([s for s in socks if s not in closed], [], [], min(left, 0.2))
        for sock in ready:
            try:
                data = sock.recv(65_536)
            except ConnectionResetError:
                data = b""
            if data:
                received[sock] += data
            else:
                closed[sock] = received[sock]
    return closed


def _health(url: str) -> int:
    return httpx.get(f"{url}/health", timeout=2).status_code


def test_stalled_bodies_get_408_and_are_closed_while_health_answers(
    start_server: Any, hotpot_bm25: IndexRetriever
) -> None:
    limits = ServerLimits(body_timeout_s=1.0, idle_timeout_s=1.0, max_connections=1000, freeze_gc=False)
    with start_server(hotpot_bm25, limits) as server, _sockets(server.port, 200, HEAD + b'{"queries": ["fi') as socks:
        started = time.monotonic()
        assert _health(server.url) == 200  # 200 stalled bodies do not lock anyone out
        assert httpx.post(f"{server.url}/search", json={"queries": ["film"], "k": 1}).status_code == 200
        closed = _until_closed(socks, 5.0)
        took = time.monotonic() - started
        assert len(closed) == len(socks), f"{len(socks) - len(closed)} stalled connections still open after 5 s"
        assert took >= 0.9  # not before the deadline
        for data in closed.values():
            assert data.startswith(b"HTTP/1.1 408 ") and b"connection: close" in data.lower()
            assert b"body_timeout_s" in data
        assert httpx.get(f"{server.url}/stats").json()["timed_out_408"] == 200
        assert _health(server.url) == 200


def test_half_sent_heads_and_silent_connections_are_closed_after_the_idle_timeout(
    start_server: Any, hotpot_bm25: IndexRetriever
) -> None:
    """uvicorn times out only a keep-alive connection that stays silent: one that sends nothing from the start, or
    a few bytes of a request line, used to be held for good."""
    limits = ServerLimits(body_timeout_s=5.0, idle_timeout_s=0.5, max_connections=1000, freeze_gc=False)
    with (
        start_server(hotpot_bm25, limits) as server,
        _sockets(server.port, 50, b"") as silent,
        _sockets(server.port, 50, b"POST /search HT") as half_line,
        _sockets(server.port, 50, HEAD[:60]) as half_head,
    ):
        closed = _until_closed(silent + half_line + half_head, 4.0)
        assert len(closed) == 150, f"{150 - len(closed)} connections without a full request head still open"
        assert all(data == b"" for data in closed.values())  # nothing to answer: closed quietly
        assert _health(server.url) == 200


def test_a_keep_alive_connection_that_starts_a_request_and_stalls_is_closed(
    start_server: Any, hotpot_bm25: IndexRetriever
) -> None:
    """After a response uvicorn arms its keep-alive timer but cancels it on any byte, so a next request that
    stops mid-head was never timed out."""
    limits = ServerLimits(idle_timeout_s=0.5, max_connections=100, freeze_gc=False)
    with start_server(hotpot_bm25, limits) as server, socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while b'"status":"ok"' not in first:
            first += sock.recv(4096)
        assert first.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /hea")
        closed = _until_closed([sock], 3.0)
        assert closed == {sock: b""}


def test_connections_over_the_cap_get_503_at_once_and_the_server_recovers(
    start_server: Any, hotpot_bm25: IndexRetriever
) -> None:
    cap = 10
    limits = ServerLimits(body_timeout_s=1.0, idle_timeout_s=1.0, max_connections=cap, freeze_gc=False)
    with start_server(hotpot_bm25, limits) as server, _sockets(server.port, 3 * cap, HEAD + b"{") as socks:
        refused = _until_closed(socks, 0.5)  # well before the body deadline
        assert len(refused) >= 2 * cap and len(socks) - len(refused) < cap
        assert all(data.startswith(b"HTTP/1.1 503 ") for data in refused.values())
        rest = _until_closed([s for s in socks if s not in refused], 4.0)  # the held ones time out
        assert len(refused) + len(rest) == len(socks)
        assert all(data.startswith(b"HTTP/1.1 408 ") for data in rest.values())
        assert _health(server.url) == 200


def test_limits_reach_uvicorn_and_are_checked() -> None:
    from rlloom.retrieval.server import uvicorn_options

    options = uvicorn_options(ServerLimits(idle_timeout_s=2.5, max_connections=64))
    assert options["timeout_keep_alive"] == 2.5 and options["limit_concurrency"] == 64
    assert ServerLimits().connection_limit() >= 16
    for bad in ({"body_timeout_s": 0}, {"idle_timeout_s": -1}, {"max_connections": 1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ServerLimits(**bad)


def test_deadlines_cancel_only_late_waits_and_pass_other_cancellations_on() -> None:
    import asyncio

    from rlloom.retrieval.deadlines import Deadlines

    deadlines = Deadlines(0.2)

    async def wait(seconds: float) -> str:
        watched = deadlines.watch()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            if not deadlines.expired(watched):
                raise
            assert watched is not None
            watched.uncancel()
            return "expired"
        finally:
            deadlines.release(watched)
        return "done"

    async def main() -> tuple[list[str], bool]:
        quick, slow = asyncio.create_task(wait(0.01)), asyncio.create_task(wait(5))
        shutdown = asyncio.create_task(wait(5))
        await asyncio.sleep(0.05)
        shutdown.cancel()  # not the deadline: must propagate as a cancellation
        results = [await quick, await slow]
        try:
            await shutdown
        except asyncio.CancelledError:
            return results, True
        return results, False

    started = time.monotonic()
    results, cancelled = asyncio.run(main())
    assert results == ["done", "expired"] and cancelled
    assert 0.2 <= time.monotonic() - started < 1.0  # at most one sweep interval late
