import json
import math
from pathlib import Path

import bm25s
import numpy as np
import pytest
import Stemmer

from rlloom.retrieval.bm25 import Analyzer, BM25Config
from rlloom.retrieval.corpus import read_corpus
from rlloom.retrieval.index import IndexRetriever, build_index, load_index

TINY = [
    {"id": "d0", "contents": "apple banana apple"},
    {"id": "d1", "contents": "banana cherry"},
    {"id": "d2", "contents": "cherry cherry cherry date"},
    {"id": "d3", "contents": "elderberry"},
]


def lucene_bm25(query: list[str], docs: list[list[str]], k1: float, b: float) -> list[float]:
    """Lucene's BM25 (no k1+1 factor), straight from the formula."""
    n, avgdl = len(docs), sum(map(len, docs)) / len(docs)
    scores = []
    for doc in docs:
        total = 0.0
        for term in query:
            df = sum(term in d for d in docs)
            if df == 0 or term not in doc:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            tf = doc.count(term)
            total += idf * tf / (tf + k1 * (1 - b + b * len(doc) / avgdl))
        scores.append(total)
    return scores


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in TINY))
    return path


@pytest.mark.parametrize(("k1", "b"), [(1.5, 0.75), (0.9, 0.4)])
def test_scores_match_the_lucene_formula(tmp_path: Path, tiny_corpus: Path, k1: float, b: float) -> None:
    index = load_index(build_index(tiny_corpus, tmp_path / "idx", k1=k1, b=b, stopwords="none"))
    expected = lucene_bm25(["apple", "cherry"], [r["contents"].split() for r in TINY], k1, b)
    hits = index.search(["Apple CHERRY"], k=10)[0]
    got = {h.doc_id: h.score for h in hits}
    for row, want in zip(TINY, expected, strict=True):
        if want > 0:
            assert got[row["id"]] == pytest.approx(want, rel=1e-5)
        else:
            assert row["id"] not in got  # passages sharing no term are not returned (as in Lucene)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_unknown_and_stopword_only_queries_return_nothing(tmp_path: Path, tiny_corpus: Path) -> None:
    index = load_index(build_index(tiny_corpus, tmp_path / "idx"))
    assert index.search(["zzzz qqqq", "the of and", ""], k=3) == [[], [], []]
    assert index.search([], k=3) == []


def test_k_larger_than_the_corpus_returns_every_match(tmp_path: Path, tiny_corpus: Path) -> None:
    index = load_index(build_index(tiny_corpus, tmp_path / "idx", stopwords="none"))
    assert {h.doc_id for h in index.search(["banana cherry"], k=1000)[0]} == {"d0", "d1", "d2"}


def test_analyzer_removes_stopwords_before_stemming() -> None:
    analyzer = Analyzer(BM25Config(stemmer="english"))
    assert analyzer.tokens("The runners Running in THE races") == ["runner", "run", "race"]
    assert Analyzer(BM25Config(lowercase=False, stopwords=["Foo"])).tokens("Foo foo x bar") == ["foo", "bar"]


@pytest.mark.parametrize("stemmer", [None, "english"])
def test_rankings_equal_bm25s_used_directly(tmp_path: Path, hotpot: Path, stemmer: str | None) -> None:
    docs = list(read_corpus(hotpot / "corpus.jsonl"))
    queries = [json.loads(line)["text"] for line in (hotpot / "queries.jsonl").read_text().splitlines()]
    ours = load_index(build_index(hotpot / "corpus.jsonl", tmp_path / "idx", stemmer=stemmer))
    stem = Stemmer.Stemmer(stemmer).stemWords if stemmer else None
    peer = bm25s.BM25()
    peer.index(bm25s.tokenize([d.contents for d in docs], stemmer=stem, show_progress=False), show_progress=False)
    rows, scores = peer.retrieve(bm25s.tokenize(queries, stemmer=stem, show_progress=False), k=10, show_progress=False)
    for query_hits, peer_rows, peer_scores in zip(ours.search(queries, k=10), rows, scores, strict=True):
        assert [h.score for h in query_hits] == pytest.approx(peer_scores.tolist(), rel=1e-5)
        # same passages at every score level (ties may be ordered differently)
        assert sorted(h.doc_id for h in query_hits) == sorted(docs[r].doc_id for r in peer_rows)


def test_batched_and_single_queries_agree(hotpot_bm25: IndexRetriever, hotpot: Path) -> None:
    queries = [json.loads(line)["text"] for line in (hotpot / "queries.jsonl").read_text().splitlines()]
    batched = hotpot_bm25.rank(queries * 100, 10)  # > one sparse-product chunk of 256
    for i, query in enumerate(queries * 100):
        single = hotpot_bm25.rank([query], 10)[0]
        np.testing.assert_array_equal(batched[i].rows, single.rows)


def test_bm25_variants_without_a_sparse_shortcut_still_rank(tmp_path: Path, tiny_corpus: Path) -> None:
    index = load_index(build_index(tiny_corpus, tmp_path / "idx", method="bm25+", stopwords="none"))
    hits = index.search(["apple"], k=2)[0]
    assert hits[0].doc_id == "d0"


def test_a_corpus_with_no_indexable_term_is_refused(tmp_path: Path) -> None:
    # every passage empty after analysis: bm25s would index NaN scores (average length 0) without a word
    corpus = tmp_path / "blank.jsonl"
    corpus.write_text('{"id": "1", "contents": "   "}\n{"id": "2", "contents": "the of"}\n')
    with pytest.raises(ValueError, match="no passage has an indexable term: all 2 .*stopwords='none'"):
        build_index(corpus, tmp_path / "idx")
    index = load_index(build_index(corpus, tmp_path / "idx", stopwords="none"))
    assert [h.doc_id for h in index.search(["the"], k=3)[0]] == ["2"]
