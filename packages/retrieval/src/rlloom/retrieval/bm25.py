"""BM25 over bm25s's sparse score matrix, with a configurable analyzer (lowercase, stopwords, PyStemmer stemming).

The analyzer is ours (a dozen lines) so that building and querying tokenize identically and querying never
mutates shared state: the server calls `rank` from a worker thread while other requests arrive.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import ClassVar, Literal

import bm25s
import numpy as np
import scipy.sparse as sp
import Stemmer
from bm25s.stopwords import STOPWORDS_EN
from bm25s.tokenization import Tokenized
from pydantic import BaseModel, ConfigDict, Field, field_validator
from tqdm.auto import tqdm

from rlloom.retrieval.ranking import EMPTY, Ranking

BM25_DIR = "bm25"
_QUERY_CHUNK = 256  # queries per sparse product


class BM25Config(BaseModel):
    """How passages and queries are tokenized and scored."""

    model_config = ConfigDict(extra="forbid")
    # everything else is baked into the stored term scores or must tokenize queries as passages were
    QUERY_TIME: ClassVar[frozenset[str]] = frozenset({"n_threads"})

    k1: float = Field(default=1.5, gt=0, description="Term-frequency saturation; Anserini uses 0.9, bm25s 1.5.")
    b: float = Field(default=0.75, ge=0, le=1, description="Length normalisation; Anserini uses 0.4, bm25s 0.75.")
    delta: float = Field(default=0.5, ge=0, description="Only for method bm25l / bm25+.")
    method: Literal["lucene", "robertson", "atire", "bm25l", "bm25+"] = Field(
        default="lucene",
        description="BM25 variant; 'lucene' reproduces Lucene's formula (the Anserini/pyserini default).",
    )
    lowercase: bool = Field(default=True, description="Lowercase before splitting.")
    stopwords: Literal["english", "none"] | list[str] = Field(
        default="english", description="'english' (bm25s's list), 'none', or an explicit word list."
    )
    stemmer: str | None = Field(
        default=None, description="A PyStemmer language ('english', 'porter', ...) or None for no stemming."
    )
    token_pattern: str = Field(
        default=r"(?u)\b\w\w+\b", description="Regex whose matches are the tokens (bm25s default)."
    )
    n_threads: int = Field(default=0, ge=-1, description="Threads for batched queries; 0 = one thread, -1 = all cores.")

    @field_validator("stemmer")
    @classmethod
    def _known_stemmer(cls, value: str | None) -> str | None:
        if value is not None and value not in Stemmer.algorithms():
            raise ValueError(
                f"{value!r} is not a PyStemmer algorithm; choose one of {', '.join(Stemmer.algorithms())}, "
                "or null for no stemming"
            )
        return value


class Analyzer:
    """Text -> tokens: lowercase, regex split, stopword removal, then stemming (stopwords match unstemmed words)."""

    def __init__(self, config: BM25Config) -> None:
        self._lower = config.lowercase
        self._pattern = re.compile(config.token_pattern)
        if config.stopwords == "english":
            self._stop = frozenset(STOPWORDS_EN)
        elif config.stopwords == "none":
            self._stop = frozenset()
        else:
            self._stop = frozenset(config.stopwords)
        self._stemmer = Stemmer.Stemmer(config.stemmer) if config.stemmer else None

    def tokens(self, text: str) -> list[str]:
        words = [w for w in self._pattern.findall(text.lower() if self._lower else text) if w not in self._stop]
        return self._stemmer.stemWords(words) if self._stemmer is not None else words


class BM25Backend:
    """A built bm25s index plus its vocabulary; `rank` is thread-safe (read-only after load)."""

    def __init__(self, model: bm25s.BM25, config: BM25Config) -> None:
        self.model = model
        self.vocab: dict[str, int] = model.vocab_dict
        self.config = config
        self.analyzer = Analyzer(config)
        self.doc_count = int(model.scores["num_docs"])

    @classmethod
    def build(cls, batches: Iterable[list[str]], total: int, config: BM25Config) -> BM25Backend:
        """Tokenize passages batch by batch (token ids only, never the raw text) and index them."""
        analyzer = Analyzer(config)
        vocab: dict[str, int] = {"": 0}  # bm25s maps a query with no known token to "", so it needs a column
        ids: list[list[int]] = []
        with tqdm(total=total, desc="bm25: tokenizing", unit="doc", disable=total < 50_000) as bar:
            for batch in batches:
                for text in batch:
                    ids.append([vocab.setdefault(tok, len(vocab)) for tok in analyzer.tokens(text)])
                bar.update(len(batch))
        if len(vocab) == 1:  # bm25s would divide by an average length of 0 and index NaN scores
            raise ValueError(
                f"no passage has an indexable term: all {total} are empty, whitespace or stopwords (stopwords="
                f"{config.stopwords if isinstance(config.stopwords, str) else 'a custom list'}); check the corpus's "
                "text field, or pass stopwords='none'"
            )
        model = bm25s.BM25(k1=config.k1, b=config.b, delta=config.delta, method=config.method)
        model.index(Tokenized(ids=ids, vocab=vocab), show_progress=total >= 50_000)
        return cls(model, config)

    def save(self, folder: Path) -> None:
        target = folder / BM25_DIR
        self.model.save(str(target), show_progress=False)

    @classmethod
    def load(cls, folder: Path, config: BM25Config, mmap: bool = True) -> BM25Backend:
        target = folder / BM25_DIR
        model = bm25s.BM25.load(str(target), mmap=mmap, show_progress=False, load_vocab=True)
        return cls(model, config)

    def query_ids(self, query: str) -> list[int]:
        """Known token ids of a query (unknown tokens cannot match any passage, so they are dropped)."""
        return [self.vocab[t] for t in self.analyzer.tokens(query) if t in self.vocab]

    def rank(self, queries: list[str], k: int) -> list[Ranking]:
        if not queries:
            return []
        k = min(k, self.doc_count)
        if k <= 0:
            return [EMPTY for _ in queries]
        token_ids = [self.query_ids(q) for q in queries]
        if self.model.nonoccurrence_array is None:
            out: list[Ranking] = []
            for lo in range(0, len(token_ids), _QUERY_CHUNK):
                out.extend(self._rank_sparse(token_ids[lo : lo + _QUERY_CHUNK], k))
            return out
        return self._rank_bm25s(token_ids, k)

    @cached_property
    def _term_doc(self) -> sp.csr_matrix:
        """bm25s's precomputed per-term scores as a (vocab x docs) CSR matrix (no copy of the arrays)."""
        s = self.model.scores
        return sp.csr_matrix((s["data"], s["indices"], s["indptr"]), shape=(len(s["indptr"]) - 1, s["num_docs"]))

    def _rank_sparse(self, token_ids: list[list[int]], k: int) -> list[Ranking]:
        """All queries of a chunk in one sparse product (query-term counts x term-doc scores).

        Same sums as bm25s's per-query loop (a repeated query term counts twice there too), but one C call per
        chunk instead of a Python iteration per query; the product only holds matching passages, so memory is
        bounded by the postings touched, whatever the corpus size.
        """
        term_doc = self._term_doc
        lengths = [len(ids) for ids in token_ids]
        query_rows = np.repeat(np.arange(len(token_ids)), lengths)
        cols = np.fromiter((t for ids in token_ids for t in ids), dtype=np.int64, count=sum(lengths))
        queries = sp.csr_matrix(
            (np.ones(len(cols), dtype=term_doc.dtype), (query_rows, cols)), shape=(len(token_ids), term_doc.shape[0])
        )
        scores = (queries @ term_doc).tocsr()
        scores.eliminate_zeros()  # the product only holds passages sharing a term; drop exact-zero sums
        indptr = scores.indptr.tolist()
        out = []
        for i in range(len(token_ids)):
            lo, hi = indptr[i], indptr[i + 1]
            values, rows = scores.data[lo:hi], scores.indices[lo:hi]
            if len(values) > k:
                top = np.argpartition(-values, k - 1)[:k]
                values, rows = values[top], rows[top]
            order = np.lexsort((rows, -values))  # best score first, ties by row like a stable sort
            out.append(Ranking(rows[order].astype(np.int64), values[order].astype(np.float32)))
        return out

    def _rank_bm25s(self, token_ids: list[list[int]], k: int) -> list[Ranking]:
        """bm25l / bm25+ add a per-term non-occurrence score to every passage: bm25s's own loop handles that."""
        rows, scores = self.model.retrieve(
            token_ids, k=k, show_progress=False, n_threads=self.config.n_threads, return_as="tuple"
        )
        out = []
        for query_rows, query_scores in zip(np.asarray(rows), np.asarray(scores), strict=True):
            keep = query_scores > 0  # a passage sharing no term with the query did not match (as in Lucene)
            out.append(Ranking(query_rows[keep].astype(np.int64), query_scores[keep].astype(np.float32)))
        return out
