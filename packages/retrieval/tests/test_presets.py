"""Named presets for Search-R1's retrievers: bm25-pyserini scores by Lucene's BM25 with Anserini's parameters and
Porter stems; e5 encodes with Search-R1's prefixes, mean pooling and 256-token truncation (checked on the local
all-MiniLM-L6-v2 weights against a plain transformers forward pass, since e5 itself cannot be downloaded here)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rlloom.retrieval.cli import main
from rlloom.retrieval.index import build_index, load_index
from rlloom.retrieval.presets import PRESETS

# tokens after lowercase, Lucene's stopwords and the original Porter stemmer, worked out by hand
CORPUS = [
    ("a", "Generously running dogs"),  # gener run dog
    ("b", "The dog runs and runs"),  # dog run run
    ("c", "A cat is sleeping"),  # cat sleep
    ("d", "I x"),  # i x: single characters are tokens, as in Lucene's StandardTokenizer
]
TOKENS = {"a": ["gener", "run", "dog"], "b": ["dog", "run", "run"], "c": ["cat", "sleep"], "d": ["i", "x"]}


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in CORPUS))
    return path


def _lucene_bm25(query: list[str], k1: float, b: float) -> dict[str, float]:
    """Lucene's BM25Similarity (>= 8): idf = ln(1 + (N - n + 0.5) / (n + 0.5)), tf / (tf + k1 (1 - b + b dl/avgdl))."""
    n_docs = len(TOKENS)
    avgdl = sum(len(t) for t in TOKENS.values()) / n_docs
    scores = {}
    for doc, tokens in TOKENS.items():
        score = 0.0
        for term in query:
            df = sum(term in t for t in TOKENS.values())
            tf = tokens.count(term)
            if tf:
                idf = math.log(1 + (n_docs - df + 0.5) / (df + 0.5))
                score += idf * tf / (tf + k1 * (1 - b + b * len(tokens) / avgdl))
        if score:
            scores[doc] = score
    return scores


def test_bm25_pyserini_scores_like_lucene_with_anserini_parameters(tmp_path: Path) -> None:
    index = load_index(build_index(_corpus(tmp_path), tmp_path / "idx", preset="bm25-pyserini"))
    assert index.manifest.backend == "bm25"
    params = index.manifest.params
    assert (params["k1"], params["b"], params["stemmer"], params["method"]) == (0.9, 0.4, "porter", "lucene")
    # "generous" and "generously" share Porter's stem "gener" (Porter2, PyStemmer's "english", keeps "generous")
    hits = index.search(["generous running dog"], 4)[0]
    expected = _lucene_bm25(["gener", "run", "dog"], 0.9, 0.4)
    assert {h.doc_id: h.score for h in hits} == pytest.approx(expected, rel=1e-5)
    assert [h.doc_id for h in hits] == sorted(expected, key=lambda d: -expected[d])
    assert [h.doc_id for h in index.search(["x"], 2)[0]] == ["d"]  # a one-letter token is searchable
    assert _lucene_bm25(["gener", "run", "dog"], 1.5, 0.75) != pytest.approx(expected)  # the parameters matter


def test_options_given_with_a_preset_win_and_conflicts_are_refused(tmp_path: Path) -> None:
    index = load_index(build_index(_corpus(tmp_path), tmp_path / "idx", preset="bm25-pyserini", k1=1.2))
    assert (index.manifest.params["k1"], index.manifest.params["b"]) == (1.2, 0.4)
    with pytest.raises(ValueError, match="preset 'e5' builds a dense index, but backend 'bm25'"):
        build_index(_corpus(tmp_path), tmp_path / "x", "bm25", preset="e5")
    with pytest.raises(ValueError, match="unknown preset 'e6'; choose one of bm25-pyserini, e5"):
        build_index(_corpus(tmp_path), tmp_path / "x", preset="e6")


def test_cli_builds_with_a_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "idx"
    assert (
        main(["build-index", "--corpus", str(_corpus(tmp_path)), "--out", str(out), "--preset", "bm25-pyserini"]) == 0
    )
    printed = capsys.readouterr().out
    assert "built bm25 index" in printed and "(preset bm25-pyserini)" in printed
    assert load_index(out).manifest.params["stemmer"] == "porter"
    code = main(["build-index", "--corpus", str(_corpus(tmp_path)), "--out", str(tmp_path / "e5"), "--preset", "e5"])
    assert code == 2 and "option 'model' is required" in capsys.readouterr().err  # e5 needs the model's folder


def _mean_pooled(model_dir: str, texts: list[str], max_length: int) -> np.ndarray:
    """Search-R1's encoder, written out with transformers: tokenize (truncate at max_length), mean over the
    attention mask, L2-normalise."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    batch = tokenizer(texts, max_length=max_length, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def test_e5_preset_wires_prefixes_mean_pooling_and_256_tokens(tmp_path: Path, minilm_path: str) -> None:
    pytest.importorskip("faiss", reason="the dense tests need the `dense` extra (faiss-cpu)")
    long_text = " ".join(["river"] * 150 + ["mountain"] * 300)  # over 256 tokens: the tail must be cut
    corpus = tmp_path / "corpus.jsonl"
    rows = [{"id": "0", "contents": '"Rivers"\nA river flows to the sea.'}, {"id": "1", "contents": long_text}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = build_index(corpus, tmp_path / "e5", preset="e5", model=minilm_path, cache_dir=None)
    index = load_index(path)
    assert index.manifest.params["pooling"] == "mean" and index.manifest.params["max_length"] == 256

    stored = np.load(path / "dense" / "embeddings.f16.npy").astype(np.float32)
    want = _mean_pooled(minilm_path, ["passage: " + r["contents"] for r in rows], 256)
    np.testing.assert_allclose(stored, want, atol=3e-3)
    untruncated = _mean_pooled(minilm_path, ["passage: " + long_text], 512)[0]
    assert float(untruncated @ want[1]) < 0.99  # 256 tokens really cut it: the full text embeds elsewhere

    query = "where does a river flow"
    got = index.backend.encode_queries([query])[0]  # type: ignore[attr-defined]
    np.testing.assert_allclose(got, _mean_pooled(minilm_path, ["query: " + query], 256)[0], atol=1e-5)
    bare = _mean_pooled(minilm_path, [query], 256)[0]
    assert float(bare @ got) < 0.999  # the prefix is really there
    assert PRESETS["e5"].options["query_prefix"] == "query: "


def _faiss_flat(vectors: np.ndarray, path: Path) -> Path:
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    faiss.write_index(index, str(path))
    return path


def test_a_prebuilt_faiss_flat_index_is_served_without_re_encoding(
    tmp_path: Path, minilm_path: str, search_r1_corpus: Path
) -> None:
    """Search-R1's wiki-18 e5_Flat.index, in small: vector i embeds line i's `contents` with e5's settings."""
    pytest.importorskip("faiss", reason="the dense tests need the `dense` extra (faiss-cpu)")
    from rlloom.retrieval.types import IndexLoadError

    rows = [json.loads(line) for line in search_r1_corpus.read_text().splitlines()]
    vectors = _mean_pooled(minilm_path, ["passage: " + r["contents"] for r in rows], 256)
    flat = _faiss_flat(vectors, tmp_path / "e5_Flat.index")
    out = tmp_path / "wiki-e5"
    code = main(["import-faiss", "--faiss", str(flat), "--corpus", str(search_r1_corpus), "--out", str(out),
                 "--opt", f"model={minilm_path}"])  # fmt: skip
    assert code == 0
    index = load_index(out)  # loading re-embeds the first passage and finds the stored vector
    assert index.manifest.backend == "dense" and index.manifest.params["query_prefix"] == "query: "
    queries = ["who wrote the iliad", "capital of france"]
    sims = _mean_pooled(minilm_path, ["query: " + q for q in queries], 256) @ vectors.T
    for q, hits in enumerate(index.search(queries, 3)):
        top = np.argsort(-sims[q])[:3]
        assert [h.doc_id for h in hits] == [rows[i]["id"] for i in top]
        assert [h.score for h in hits] == pytest.approx(sims[q, top].tolist(), abs=2e-3)

    # vectors of another corpus order (or another model): the first passage is not what vector 0 embeds
    shuffled = _faiss_flat(vectors[::-1], tmp_path / "shuffled.index")
    from rlloom.retrieval.prebuilt import import_faiss_index

    wrong = import_faiss_index(search_r1_corpus, shuffled, tmp_path / "wrong", model=minilm_path)
    with pytest.raises(IndexLoadError, match="does not reproduce the stored passage embeddings"):
        load_index(wrong)
    short = tmp_path / "short.jsonl"
    short.write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))
    with pytest.raises(ValueError, match=f"holds {len(rows) - 1} passages but .* holds {len(rows)} vectors"):
        import_faiss_index(short, flat, tmp_path / "short-idx", model=minilm_path)
    assert not (tmp_path / "short-idx").exists()  # nothing half-built is left behind
