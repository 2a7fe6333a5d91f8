"""pyserini's Lucene BM25: runs only where the optional `lucene` extra and a Java 21+ runtime are present."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.lucene


def _lucene_unavailable() -> str | None:
    try:
        import pyserini  # noqa: F401
    except ImportError:
        return "pyserini is not installed: the `lucene` extra is optional (pip install 'rlloom-retrieval[lucene]')"
    from rlloom.retrieval.lucene import prepare_java

    try:
        prepare_java()
    except (RuntimeError, ImportError) as err:
        return f"no Java 21+ runtime for pyserini: {err}"
    return None


REASON = _lucene_unavailable()
skip = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@skip
def test_lucene_index_ranks_like_bm25(tmp_path: Path, hotpot: Path) -> None:
    from rlloom.retrieval.index import build_index, load_index

    lucene = load_index(build_index(hotpot / "corpus.jsonl", tmp_path / "lucene", backend="lucene"))
    ours = load_index(build_index(hotpot / "corpus.jsonl", tmp_path / "bm25", stemmer="porter", k1=0.9, b=0.4))
    assert lucene.manifest.doc_count == 50
    queries = [json.loads(line)["text"] for line in (hotpot / "queries.jsonl").read_text().splitlines()]
    lucene_hits, our_hits = lucene.search(queries, 5), ours.search(queries, 5)
    for hits in lucene_hits:
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    # different analyzers (Lucene's English vs ours), same formula: the top passage agrees on most queries
    agree = sum(a[0].doc_id == b[0].doc_id for a, b in zip(lucene_hits, our_hits, strict=True))
    assert agree >= len(queries) - 1
