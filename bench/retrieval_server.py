"""Server throughput under many concurrent agents: our micro-batching server vs a one-request-at-a-time floor.

32 concurrent clients each send 500 Search-R1 `/retrieve` requests of one query (topk 3, scores on: what the
Search-R1 trainer sends), over keep-alive connections. Both servers serve the same bm25 index of HotpotQA-500
with the same response format; the floor, written here, answers each request on the event loop with its own
backend call (no batching, one at a time), which is what a sync Search-R1-style handler amounts to for a
single-threaded retriever. Servers run in their own processes; the load generator is one asyncio process
(httpx), so on a 2-core machine clients and server compete for the same cores: read the ratio.

    .venv/bin/python bench/retrieval_server.py [--clients 32] [--requests 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from rlloom.retrieval.server import RetrieveRequest

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "beir_style_from_ircot500"


def floor_app(index: str):  # type: ignore[no-untyped-def]
    """The baseline: one backend call per request, made on the event loop, so requests are served one by one."""
    from fastapi import FastAPI

    from rlloom.retrieval.index import load_index

    retriever = load_index(index)
    app = FastAPI()

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest) -> dict:
        results = retriever.search(request.queries, request.topk or 3)
        return {
            "result": [
                [{"document": {"id": h.doc_id, "contents": h.contents}, "score": h.score} for h in hits]
                for hits in results
            ]
        }

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    return app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(cmd: list[str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not come up in 120 s")


async def load(url: str, queries: list[str], clients: int, requests: int) -> tuple[float, list[float], int]:
    """Wall seconds, per-request latencies, and the number of failed requests."""
    latencies: list[float] = []
    failures = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:

        async def client(c: int, n: int) -> None:
            nonlocal failures
            for i in range(n):
                query = queries[(c * requests + i) % len(queries)]
                payload = {"queries": [query], "topk": 3, "return_scores": True}
                t0 = time.perf_counter()
                try:
                    response = await http.post("/retrieve", json=payload)
                except httpx.TransportError:  # a keep-alive connection closed under us: count it, send again
                    failures += 1
                    response = await http.post("/retrieve", json=payload)
                latencies.append(time.perf_counter() - t0)
                if response.status_code != 200 or len(response.json()["result"][0]) == 0:
                    failures += 1

        await asyncio.gather(*(client(c, 20) for c in range(clients)))  # warm-up: open connections, fill caches
        latencies.clear()
        t0 = time.perf_counter()
        failures = 0
        await asyncio.gather(*(client(c, requests) for c in range(clients)))
        wall = time.perf_counter() - t0
    return wall, latencies, failures


def measure(name: str, cmd: list[str], port: int, queries: list[str], args: argparse.Namespace) -> dict:
    proc = start(cmd, port)
    try:
        wall, lat, failures = asyncio.run(load(f"http://127.0.0.1:{port}", queries, args.clients, args.requests))
        stats = httpx.get(f"http://127.0.0.1:{port}/stats").json() if name == "ours" else {}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lat_ms = sorted(x * 1000 for x in lat)
    return {
        "server": name,
        "requests": len(lat),
        "rps": len(lat) / wall,
        "p50_ms": statistics.median(lat_ms),
        "p99_ms": lat_ms[int(0.99 * (len(lat_ms) - 1))],
        "failures": failures,
        "mean_batch": stats.get("mean_batch_queries"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=500, help="requests per client")
    parser.add_argument("--floor-server", nargs=2, metavar=("INDEX", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        import uvicorn

        index, port = args.floor_server
        uvicorn.run(floor_app(index), host="127.0.0.1", port=int(port), log_level="warning")
        return

    from rlloom.retrieval.index import build_index

    queries = [json.loads(line)["text"] for line in (args.data / "queries.jsonl").read_text().splitlines()]
    with tempfile.TemporaryDirectory(prefix="rlloom-bench-server-") as tmp:
        index = str(build_index(args.data / "corpus.jsonl", Path(tmp) / "bm25"))
        results = []
        port = free_port()
        ours = [sys.executable, "-m", "rlloom.retrieval.cli", "serve", "--index", index, "--port", str(port)]
        results.append(measure("ours", ours, port, queries, args))
        port = free_port()
        floor = [sys.executable, __file__, "--floor-server", index, str(port)]
        results.append(measure("floor (one request at a time)", floor, port, queries, args))

    print(
        f"\n{args.clients} clients x {args.requests} requests of 1 query (topk 3), bm25 on HotpotQA-500, "
        f"{os.cpu_count()} CPUs shared by clients and server\n"
    )
    print("| server | requests | requests/s | p50 (ms) | p99 (ms) | failed/resent | mean queries per backend call |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        batch = "" if r["mean_batch"] is None else f"{r['mean_batch']:.1f}"
        print(
            f"| {r['server']} | {r['requests']} | {r['rps']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r['failures']} | {batch} |"
        )
    print(f"\nours / floor throughput: {results[0]['rps'] / results[1]['rps']:.2f}x")


if __name__ == "__main__":
    main()
