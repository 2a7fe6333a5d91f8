"""The retriever every command searches with: an index folder loaded in-process, or a retrieval server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import httpx

from rlloom.agent import ThreadedRetriever
from rlloom.retrieval import load_index
from rlloom.retrieval.client import RetrievalClient
from rlloom.retrieval.manifest import read_manifest
from rlloom.retrieval.types import IndexLoadError

SEARCH_R1_API_FLAG = "--retrieval-api search-r1"
SEARCH_R1_API_OVERRIDE = "the override search.retrieval_api=search-r1"
"""How `train` selects Search-R1's wire format: it has no --retrieval-api flag, the config's search section does."""


def check_retrieval(
    index: Path | None,
    url: str | None,
    *,
    api: Literal["native", "search-r1"] = "native",
    timeout: float = 5.0,
    search_r1_setting: str = SEARCH_R1_API_FLAG,
) -> None:
    """Refuse, before any model loads, an --index that is not an rlloom index or a --retrieval-url nobody answers
    (ValueError naming the flag); cheap: reads the index's manifest, or GETs the server's /health once.
    `search_r1_setting` is how the calling command selects Search-R1's API, for the error that suggests it."""
    if index is not None:
        try:
            read_manifest(index)
        except IndexLoadError as err:
            raise ValueError(f"--index {index}: {err}") from None
    if url is not None:
        try:
            response = httpx.get(f"{url.rstrip('/')}/health", timeout=timeout)
        except httpx.HTTPError as err:  # refused, timed out, or not an http(s) URL
            raise ValueError(
                f"--retrieval-url {url} is unreachable ({type(err).__name__}: {err}); start a server "
                "(`rlloom-retrieval serve --index DIR`) or fix the URL"
            ) from None
        # Search-R1's own server has only /retrieve: any answer at all shows it is up
        if api == "native" and response.status_code != 200:
            raise ValueError(
                f"--retrieval-url {url} answered GET /health with HTTP {response.status_code}: not an rlloom "
                f"retrieval server? (for Search-R1's server use {search_r1_setting})"
            )


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
