"""The retriever every command searches with: an index folder loaded in-process, or a retrieval server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from rlloom.agent import ThreadedRetriever
from rlloom.retrieval import load_index
from rlloom.retrieval.client import RetrievalClient


@contextmanager
def open_retriever(
    index: Path | None,
    url: str | None,
    *,
    api: Literal["native", "search-r1"] = "native",
    threads: int = 64,
) -> Iterator[ThreadedRetriever]:
    """Exactly one of `index` (built by `rlloom-retrieval build-index`) or `url`; blocking calls run on threads."""
    if (index is None) == (url is None):
        raise ValueError("give exactly one of an index folder (--index) or a retrieval server (--retrieval-url)")
    if index is not None and not index.is_dir():
        raise ValueError(f"--index {index} is not a folder (build one with rlloom-retrieval build-index)")
    backend = load_index(index) if index is not None else RetrievalClient(str(url), api=api)
    retriever = ThreadedRetriever(backend, max_threads=threads)
    try:
        yield retriever
    finally:
        retriever.close()
        if isinstance(backend, RetrievalClient):
            backend.close()
