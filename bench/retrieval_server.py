"""Server throughput under many concurrent agents: our micro-batching server vs one-request-at-a-time floors.

32 concurrent clients each send 500 Search-R1 `/retrieve` requests of one query (topk 3, scores on: what the
Search-R1 trainer sends) over keep-alive connections. Every server serves the same bm25 index of HotpotQA-500 with
the same response format, under the same uvicorn (httptools + uvloop when installed). The floors, written here:

- `floor: Search-R1 handler`: Search-R1's `retrieval_server.py` shape, a FastAPI *sync* `def` endpoint (FastAPI runs
  it in its thread pool) making one backend call per request.
- `floor: one at a time on the loop`: an `async def` endpoint calling the backend directly on the event loop, so
  requests are strictly served one by one without thread hops (the cheapest unbatched server we could write).

The load generator is a minimal asyncio HTTP/1.1 client written here (uvloop when installed): an httpx client
costs about 1 ms of CPU per request, which on a 2-core machine shared by clients and server would cap every server
at the client's speed and hide the difference. Servers run in their own processes; the methods alternate within
each repeat and the tables give medians over repeats.

    .venv/bin/python bench/retrieval_server.py [--clients 32] [--requests 500] [--repeats 3] [--workers 2]
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
from typing import Any

import httpx

from rlloom.retrieval.server import RetrieveRequest

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "beir_style_from_ircot500"
SEARCH_R1_FLOOR = "floor: Search-R1 handler (sync def, thread pool)"
LOOP_FLOOR = "floor: one at a time on the loop (async def)"


# ----------------------------------------------------------------------------------------------- floors
def floor_app(index: str, style: str) -> Any:
    """An unbatched server: one backend call per request, in Search-R1's sync style or directly on the loop."""
    from fastapi import FastAPI

    from rlloom.retrieval.index import load_index

    retriever = load_index(index)
    app = FastAPI()

    def answer(request: RetrieveRequest) -> dict[str, Any]:
        results = retriever.search(request.queries, request.topk or 3)
        return {
            "result": [
                [{"document": {"id": h.doc_id, "contents": h.contents}, "score": h.score} for h in hits]
                for hits in results
            ]
        }

    if style == "sync":

        @app.post("/retrieve")
        def retrieve_sync(request: RetrieveRequest) -> dict[str, Any]:
            return answer(request)

    else:

        @app.post("/retrieve")
        async def retrieve_on_loop(request: RetrieveRequest) -> dict[str, Any]:
            return answer(request)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


# ----------------------------------------------------------------------------------------------- load
class LoadResult:
    def __init__(self, wall: float, latencies: list[float], failures: int) -> None:
        self.wall, self.latencies, self.failures = wall, sorted(latencies), failures

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.wall

    def percentile_ms(self, q: float) -> float:
        return self.latencies[int(q * (len(self.latencies) - 1))] * 1000


async def _client(port: int, bodies: list[bytes], latencies: list[float]) -> int:
    """One keep-alive connection sending `bodies` in turn; returns how many answers were not a non-empty 200."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    failures = 0
    try:
        for body in bodies:
            head = b"POST /retrieve HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: "
            t0 = time.perf_counter()
            writer.write(b"%s%d\r\n\r\n%s" % (head, len(body), body))
            status = int((await reader.readline()).split()[1])
            length = -1
            while (line := await reader.readline()) != b"\r\n":
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length < 0:
                raise RuntimeError("the server answered without content-length; this client reads only that")
            data = await reader.readexactly(length)
            latencies.append(time.perf_counter() - t0)
            if status != 200 or not json.loads(data)["result"][0]:
                failures += 1
    finally:
        writer.close()
    return failures


async def load(port: int, queries: list[str], clients: int, requests: int) -> LoadResult:
    def bodies(c: int, n: int) -> list[bytes]:
        picks = (queries[(c * n + i) % len(queries)] for i in range(n))
        return [json.dumps({"queries": [q], "topk": 3, "return_scores": True}).encode() for q in picks]

    warm: list[float] = []  # open connections, fill caches, let the server's first requests pass
    await asyncio.gather(*(_client(port, bodies(c, 20), warm) for c in range(clients)))
    latencies: list[float] = []
    work = [bodies(c, requests) for c in range(clients)]
    t0 = time.perf_counter()
    failures = await asyncio.gather(*(_client(port, w, latencies) for w in work))
    return LoadResult(time.perf_counter() - t0, latencies, sum(failures))


# ----------------------------------------------------------------------------------------------- harness
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


def run_loop(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def measure(cmd: list[str], port: int, queries: list[str], args: argparse.Namespace) -> tuple[LoadResult, dict]:
    proc = start(cmd, port)
    try:
        result = run_loop(load(port, queries, args.clients, args.requests))
        stats = httpx.get(f"http://127.0.0.1:{port}/stats").json() if "serve" in cmd else {}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return result, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=500, help="requests per client")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="also measure ours with this many worker processes")
    parser.add_argument("--floor-server", nargs=3, metavar=("STYLE", "INDEX", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        import uvicorn

        style, index, port = args.floor_server
        uvicorn.run(floor_app(index, style), host="127.0.0.1", port=int(port), log_level="warning")
        return

    from rlloom.retrieval.index import build_index

    queries = [json.loads(line)["text"] for line in (args.data / "queries.jsonl").read_text().splitlines()]
    with tempfile.TemporaryDirectory(prefix="rlloom-bench-server-") as tmp:
        index = str(build_index(args.data / "corpus.jsonl", Path(tmp) / "bm25"))

        def ours(workers: int) -> list[str]:
            serve = [sys.executable, "-m", "rlloom.retrieval.cli", "serve", "--index", index]
            return [*serve, "--workers", str(workers), "--port"]

        methods: dict[str, list[str]] = {"ours (micro-batching, 1 process)": ours(1)}
        if args.workers > 1:
            methods[f"ours (--workers {args.workers})"] = ours(args.workers)
        methods[SEARCH_R1_FLOOR] = [sys.executable, __file__, "--floor-server", "sync", index]
        methods[LOOP_FLOOR] = [sys.executable, __file__, "--floor-server", "loop", index]
        runs: dict[str, list[tuple[LoadResult, dict]]] = {name: [] for name in methods}
        for repeat in range(args.repeats):
            for name, cmd in methods.items():
                port = free_port()
                runs[name].append(measure([*cmd, str(port)], port, queries, args))
                r = runs[name][-1][0]
                print(f"repeat {repeat + 1}: {name}: {r.rps:.0f} req/s, p99 {r.percentile_ms(0.99):.1f} ms", flush=True)

    load_avg = os.getloadavg()
    print(
        f"\n{args.clients} clients x {args.requests} requests of 1 query (topk 3), bm25 on HotpotQA-500, "
        f"{os.cpu_count()} CPUs shared by clients and servers; medians over {args.repeats} repeats; "
        f"load average at the end {load_avg[0]:.2f}\n"
    )
    print("| server | requests/s | p50 (ms) | p99 (ms) | failed | mean queries per backend call |")
    print("|---|---|---|---|---|---|")
    median_rps = {}
    for name, measured in runs.items():
        rps = statistics.median(r.rps for r, _ in measured)
        median_rps[name] = rps
        p50 = statistics.median(r.percentile_ms(0.5) for r, _ in measured)
        p99 = statistics.median(r.percentile_ms(0.99) for r, _ in measured)
        failed = sum(r.failures for r, _ in measured)
        batch = [s["mean_batch_queries"] for _, s in measured if s.get("mean_batch_queries")]
        mean_batch = f"{statistics.median(batch):.1f}" if batch else ""
        print(f"| {name} | {rps:.0f} | {p50:.1f} | {p99:.1f} | {failed} | {mean_batch} |")
    ours_rps = median_rps["ours (micro-batching, 1 process)"]
    print(f"\nours / {SEARCH_R1_FLOOR}: {ours_rps / median_rps[SEARCH_R1_FLOOR]:.2f}x")
    print(f"ours / {LOOP_FLOOR}: {ours_rps / median_rps[LOOP_FLOOR]:.2f}x")


if __name__ == "__main__":
    main()
