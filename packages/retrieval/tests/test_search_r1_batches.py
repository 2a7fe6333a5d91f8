"""Search-R1's real batch shapes: its trainer sends every search of a turn in one request (512 prompts x 5 samples
= 2,560 queries, `search_r1/llm_agent/generation.py` `_batch_search`) and reads `response.json()['result']`, one
list per query, each item's `['document']['contents']`. The server used to refuse more than 512 queries, and a
whole batch for one query over 4,096 characters; the trainer then died with `KeyError: 'result'`."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import requests

from rlloom.retrieval.index import IndexRetriever, build_index, load_index
from rlloom.retrieval.server import ServerLimits

DATA = Path(__file__).parent / "data"
TURN = 512 * 5  # Search-R1's GRPO turn: train_batch_size 512, n_agent 5


def _post_like_search_r1(url: str, payload: dict[str, Any]) -> Any:
    """What Search-R1's `_batch_search` does: `requests.post(search_url, json=payload).json()`, no timeout."""
    return requests.post(url, json=payload).json()  # Search-R1 sets no timeout


def _search_r1_generation() -> ModuleType:
    """Search-R1's own trainer code (tests/data/search_r1_generation.py, copied verbatim at a14dc3a)."""
    spec = importlib.util.spec_from_file_location("search_r1_generation", DATA / "search_r1_generation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _passages_to_string(result: list[dict[str, Any]]) -> str:
    """How Search-R1's trainer reads one query's list (`_passages2string`): the contents' first line is the title."""
    lines = []
    for idx, item in enumerate(result):
        title, _, text = item["document"]["contents"].partition("\n")
        lines.append(f"Doc {idx + 1}(Title: {title}) {text}")
    return "\n".join(lines)


def _turn_queries(hotpot: Path) -> list[str]:
    """2,560 distinct queries (a turn's searches differ), two of them longer than 4,096 characters."""
    titles = [json.loads(line)["title"] for line in (hotpot / "corpus.jsonl").read_text().splitlines()]
    queries = [f"{titles[i % len(titles)]} {titles[(7 * i + 3) % len(titles)]} {i}" for i in range(TURN)]
    queries[17] = "Shirley Temple " * 400  # 6,000 characters
    queries[2000] = "radio program " * 350 + "Corliss Archer"  # 4,914 characters
    return queries


@pytest.fixture(scope="module")
def served_index(tmp_path_factory: pytest.TempPathFactory, hotpot: Path) -> Any:
    """The index served by the documented command, `rlloom-retrieval serve --index DIR --port P` (defaults)."""
    index = build_index(hotpot / "corpus.jsonl", tmp_path_factory.mktemp("turn") / "bm25")
    with _serve(tmp_path_factory, index) as (url, log):
        yield url, load_index(index), log


@contextlib.contextmanager
def _serve(tmp_path_factory: pytest.TempPathFactory, index: Path, *options: str) -> Iterator[tuple[str, Path]]:
    """`rlloom-retrieval serve --index DIR --port P [options]` as a subprocess, until the block ends."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    log = tmp_path_factory.mktemp("turn-log") / "stderr.txt"
    cmd = [sys.executable, "-m", "rlloom.retrieval.cli", "serve", "--index", str(index), "--port", str(port), *options]
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, log.read_text()[-2000:]
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the server did not come up in 120 s"
                time.sleep(0.1)
            yield url, log
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_a_2560_query_turn_gets_one_result_list_per_query(served_index: Any, hotpot: Path) -> None:
    url, index, log = served_index
    queries = _turn_queries(hotpot)
    body = _post_like_search_r1(f"{url}/retrieve", {"queries": queries, "topk": 3, "return_scores": True})
    result = body["result"]
    assert len(result) == TURN
    searched = [q[:4096] for q in queries]  # the server cuts a query to max_query_chars (4,096)
    expected = index.search(searched, 3)
    for got, want in zip(result, expected, strict=True):
        assert [set(item) for item in got] == [{"document", "score"}] * len(want)
        assert [item["document"]["id"] for item in got] == [h.doc_id for h in want]
        assert [item["document"]["contents"] for item in got] == [h.contents for h in want]
        assert [item["score"] for item in got] == pytest.approx([h.score for h in want])
        assert _passages_to_string(got).startswith("Doc 1(Title: ")
    # the two over-long queries were cut, reported in a field Search-R1's client does not read, and logged
    assert body["truncated_queries"] == [
        {"index": 17, "chars": 6000, "limit": "4096 characters"},
        {"index": 2000, "chars": 4914, "limit": "4096 characters"},
    ]
    stats = httpx.get(f"{url}/stats").json()
    assert stats["requests"] == 1 and stats["queries"] == TURN and stats["truncated_queries"] == 2
    assert stats["largest_batch"] <= 1024  # searched in pieces of max_batch_queries, not in one 2,560 call
    assert "2 of 2560 queries cut to fit" in log.read_text()


def test_search_r1s_own_trainer_code_completes_a_2560_query_turn(served_index: Any, hotpot: Path) -> None:
    """Search-R1's `execute_predictions` (its environment step), unchanged, on a turn of 2,560 `<search>` outputs
    plus answers, invalid actions and finished samples: one request, one observation per sample."""
    url, index, log = served_index
    r1 = _search_r1_generation()
    manager = r1.LLMGenerationManager()  # __init__ builds torch helpers these methods do not use
    manager.config = r1.GenerationConfig(
        max_turns=4, max_start_length=2048, max_prompt_length=4096, max_response_length=500, max_obs_length=500,
        num_gpus=8, search_url=f"{url}/retrieve", topk=3,
    )  # fmt: skip
    queries = _turn_queries(hotpot)
    predictions = [f"<think>I need to look this up.</think>\n<search> {q} </search>" for q in queries]
    # an inactive sample's output is "" (run_llm_loop pads the finished samples' responses with empty strings)
    others = ["<think>done</think> <answer> Shirley Temple </answer>", "no action at all", ""]
    predictions[100:100] = others  # an answer, an invalid action and an inactive sample among the searches
    active = [True] * len(predictions)
    active[102] = False
    seen_before = httpx.get(f"{url}/stats").json()
    next_obs, dones, valid, is_search = manager.execute_predictions(predictions, "<|endoftext|>", active)
    stats = httpx.get(f"{url}/stats").json()
    assert stats["requests"] - seen_before["requests"] == 1  # the whole turn in one request
    assert stats["queries"] - seen_before["queries"] == TURN
    assert stats["truncated_queries"] - seen_before["truncated_queries"] == 2
    assert len(next_obs) == len(dones) == len(valid) == len(is_search) == TURN + 3
    assert sum(is_search) == TURN and sum(valid) == TURN + 1 and sum(dones) == 2
    assert (next_obs[100], dones[100], next_obs[102], dones[102]) == ("", 1, "", 1)
    assert next_obs[101].startswith("\nMy previous action is invalid.")
    searched = [q.strip()[:4096] for q in queries]  # the trainer strips; the server cuts to 4,096 characters
    expected = index.search(searched, 3)
    observed = next_obs[:100] + next_obs[103:]
    for obs, hits in zip(observed, expected, strict=True):
        docs = "\n".join(
            f"Doc {i + 1}(Title: {t}) {x}" for i, (t, _, x) in enumerate(h.contents.partition("\n") for h in hits)
        )
        assert obs == f"\n\n<information>{docs.strip()}</information>\n\n"
    # the over-long queries: answered (3 passages each), cut, and reported beside `result`, which the trainer reads
    assert observed[17].count("Doc ") == 3 and observed[2000].count("Doc ") == 3
    raw = manager._batch_search([queries[17].strip(), "Corliss Archer"])
    assert len(raw["result"]) == 2 and [len(r) for r in raw["result"]] == [3, 3]
    assert raw["truncated_queries"] == [{"index": 0, "chars": 5999, "limit": "4096 characters"}]
    assert "2 of 2560 queries cut to fit" in log.read_text()


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> str:
    """A 2-layer, 64-wide BERT with random weights and MiniLM's tokenizer: the arithmetic of an e5 encoder (the
    index's 256-token window) at a fraction of its cost, so 2,560 queries encode in seconds on a loaded CPU."""
    torch = pytest.importorskip("torch", reason="dense retrieval needs the `dense` extra")
    from transformers import AutoTokenizer, BertConfig, BertModel

    folder = tmp_path_factory.mktemp("tiny-encoder")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        max_position_embeddings=512,
    )  # fmt: skip
    BertModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm_path).save_pretrained(folder)
    return str(folder)


@pytest.mark.slow  # ~100 s on a loaded 2-core CPU: a torch server process to start, 2,560 + 130 queries to encode
def test_search_r1s_trainer_against_the_dense_recipe(
    tmp_path_factory: pytest.TempPathFactory, hotpot: Path, tiny_encoder: str
) -> None:
    """The wiki-18 dense recipe's serve command (`--opt flat_fp16=true`) on a dense index of the slice: Search-R1's
    trainer code completes the 2,560-query turn; the answers equal the index's own in-process search (a sample of
    the queries and the two over-long ones), which the encoder's token window cuts and the server reports."""
    index = build_index(
        hotpot / "corpus.jsonl", tmp_path_factory.mktemp("dense") / "e5", backend="dense", model=tiny_encoder
    )
    r1 = _search_r1_generation()
    manager = r1.LLMGenerationManager()
    queries = _turn_queries(hotpot)
    predictions = [f"<search> {q} </search>" for q in queries]
    with _serve(tmp_path_factory, index, "--opt", "flat_fp16=true") as (url, log):
        manager.config = r1.GenerationConfig(
            max_turns=4, max_start_length=2048, max_prompt_length=4096, max_response_length=500, max_obs_length=500,
            num_gpus=8, search_url=f"{url}/retrieve", topk=3,
        )  # fmt: skip
        next_obs, dones, _, is_search = manager.execute_predictions(predictions, "<|endoftext|>", [True] * TURN)
        stats = httpx.get(f"{url}/stats").json()
    assert len(next_obs) == TURN and sum(is_search) == TURN and sum(dones) == 0
    assert stats["requests"] == 1 and stats["queries"] == TURN
    assert stats["truncated_queries"] >= 2  # the two over 4,096 characters, and any past 256 tokens
    assert "queries cut to fit" in log.read_text()
    local = load_index(index, flat_fp16=True)
    sample = sorted({*range(0, TURN, 20), 17, 2000})
    expected = local.search([queries[i].strip()[:4096] for i in sample], 3)
    for i, hits in zip(sample, expected, strict=True):
        docs = "\n".join(
            f"Doc {j + 1}(Title: {t}) {x}" for j, (t, _, x) in enumerate(h.contents.partition("\n") for h in hits)
        )
        assert next_obs[i] == f"\n\n<information>{docs.strip()}</information>\n\n", i


def test_the_turn_without_scores_and_an_empty_turn(served_index: Any, hotpot: Path) -> None:
    url, _, _ = served_index
    queries = _turn_queries(hotpot)[:TURN]
    bare = _post_like_search_r1(f"{url}/retrieve", {"queries": queries, "topk": 3})
    assert len(bare["result"]) == TURN and set(bare["result"][5][0]) == {"id", "contents"}
    assert _post_like_search_r1(f"{url}/retrieve", {"queries": [], "topk": 3, "return_scores": True}) == {"result": []}


def test_default_limits_fit_search_r1s_batches() -> None:
    limits = ServerLimits()
    assert limits.max_queries >= 4096 and limits.default_topk == 3
    two_turns = json.dumps({"queries": ["x" * 4096] * TURN, "topk": 3, "return_scores": True}).encode()
    assert len(two_turns) * 2 < limits.body_limit()


def test_over_max_queries_is_a_422_naming_the_flag(start_server: Any, hotpot_bm25: IndexRetriever) -> None:
    with start_server(hotpot_bm25, ServerLimits(max_queries=100, freeze_gc=False)) as server:
        response = httpx.post(f"{server.url}/retrieve", json={"queries": ["film"] * 101, "topk": 3})
    assert response.status_code == 422
    detail = response.json()["detail"][0]
    assert detail["loc"] == ["body", "queries"] and "--limit max_queries=101" in detail["msg"]


def test_an_answer_over_max_response_bytes_is_a_413_naming_the_limit(
    start_server: Any, hotpot_bm25: IndexRetriever
) -> None:
    """queries x topk x passage bytes is bounded: the answer is written piece by piece and stops at the limit."""
    limits = ServerLimits(max_response_bytes=50_000, max_batch_queries=16, freeze_gc=False)
    with start_server(hotpot_bm25, limits) as server:
        small = httpx.post(f"{server.url}/retrieve", json={"queries": ["film"] * 4, "topk": 3, "return_scores": True})
        assert small.status_code == 200 and len(small.content) < 50_000
        big = httpx.post(f"{server.url}/retrieve", json={"queries": ["film"] * 200, "topk": 20})
        assert big.status_code == 413
        detail = big.json()["detail"]
        assert "max_response_bytes (50000 bytes)" in detail and "--limit max_response_bytes=N" in detail
        stats = httpx.get(f"{server.url}/stats").json()
        assert stats["response_too_large_413"] == 1
        assert stats["batches"] < 200 // 16  # it stopped at the piece that crossed the limit


def test_a_large_request_shares_the_backend_with_other_clients(start_server: Any, hotpot_bm25: IndexRetriever) -> None:
    """Pieces of one big request go through the batcher like any request: the answer is the same as one call."""
    limits = ServerLimits(max_batch_queries=64, freeze_gc=False)
    queries = [f"film {i}" for i in range(300)]
    with start_server(hotpot_bm25, limits) as server:
        body = httpx.post(f"{server.url}/search", json={"queries": queries, "k": 2}).json()
        stats = httpx.get(f"{server.url}/stats").json()
    assert [[h["doc_id"] for h in hits] for hits in body["results"]] == [
        [h.doc_id for h in hits] for hits in hotpot_bm25.search(queries, 2)
    ]
    assert stats["batches"] == 5 and stats["largest_batch"] == 64
