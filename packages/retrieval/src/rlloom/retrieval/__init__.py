"""rlloom.retrieval: BM25, dense and Lucene retrieval behind one `Retriever` interface, index building, a
micro-batching HTTP server wire-compatible with Search-R1, httpx clients and IR metrics. See the README."""

from rlloom.retrieval.__about__ import __version__
from rlloom.retrieval.bm25 import BM25Config
from rlloom.retrieval.corpus import Document, read_corpus
from rlloom.retrieval.hybrid import HybridConfig, reciprocal_rank_fusion, weighted_score_fusion
from rlloom.retrieval.index import IndexRetriever, build_index, load_index
from rlloom.retrieval.types import CorpusFormatError, Hit, IndexLoadError, Retriever

__all__ = [
    "BM25Config",
    "CorpusFormatError",
    "Document",
    "Hit",
    "HybridConfig",
    "IndexLoadError",
    "IndexRetriever",
    "Retriever",
    "__version__",
    "build_index",
    "load_index",
    "read_corpus",
    "reciprocal_rank_fusion",
    "weighted_score_fusion",
]
