"""Passage storage for an index: one UTF-8 byte file plus offset arrays, memory-mapped when read.

The raw text lives once on disk and is paged in on demand, so a wiki-scale corpus is served without loading it
into Python strings. Layout under `docs/`: `text.bin` (title bytes then body bytes per passage), `text_offsets.npy`
(n+1 starts), `title_ends.npy` (where each title stops; equal to the start when there is none), `has_title.npy`,
and the same scheme for ids (`ids.bin`, `id_offsets.npy`).
"""

from __future__ import annotations

import mmap
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.typing import NDArray

from rlloom.retrieval.corpus import Document
from rlloom.retrieval.types import CorpusFormatError, IndexLoadError

DOCS_DIR = "docs"


class DocStoreWriter:
    """Append passages one at a time; offsets are kept as growing int64 arrays (8 bytes/passage each)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder / DOCS_DIR
        self.folder.mkdir(parents=True, exist_ok=True)
        self._text: BinaryIO = (self.folder / "text.bin").open("wb")
        self._ids: BinaryIO = (self.folder / "ids.bin").open("wb")
        self._text_offsets: list[int] = [0]
        self._title_ends: list[int] = []
        self._has_title: list[bool] = []
        self._id_offsets: list[int] = [0]
        self._id_hashes = array("q")  # 8 bytes a passage: finds repeated ids without a set of 21M strings

    def add(self, doc: Document) -> None:
        title = (doc.title or "").encode("utf-8")
        body = doc.text.encode("utf-8")
        start = self._text_offsets[-1]
        self._text.write(title)
        self._text.write(body)
        self._title_ends.append(start + len(title))
        self._has_title.append(doc.title is not None)
        self._text_offsets.append(start + len(title) + len(body))
        raw_id = doc.doc_id.encode("utf-8")
        self._ids.write(raw_id)
        self._id_offsets.append(self._id_offsets[-1] + len(raw_id))
        self._id_hashes.append(hash(raw_id))

    def repeated_id(self) -> tuple[str, int, int] | None:
        """The first id held by two passages, with both passage numbers (1-based), or None when ids are unique.

        A repeated id makes qrels ambiguous (which passage is relevant?) and counts one hit twice in nDCG.
        """
        hashes = np.frombuffer(self._id_hashes, dtype=np.int64)
        order = np.argsort(hashes, kind="stable")
        same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
        if not len(same):
            return None
        self._ids.flush()
        raw = (self.folder / "ids.bin").read_bytes()
        offsets = self._id_offsets
        first: tuple[str, int, int] | None = None
        for i in same.tolist():
            a, b = sorted((int(order[i]), int(order[i + 1])))
            if raw[offsets[a] : offsets[a + 1]] == raw[offsets[b] : offsets[b + 1]] and (first is None or b < first[2]):
                first = (raw[offsets[a] : offsets[a + 1]].decode("utf-8"), a + 1, b + 1)
        return first

    def close(self) -> int:
        """Flush everything and return the number of passages written."""
        self._text.close()
        self._ids.close()
        np.save(self.folder / "text_offsets.npy", np.asarray(self._text_offsets, dtype=np.int64))
        np.save(self.folder / "title_ends.npy", np.asarray(self._title_ends, dtype=np.int64))
        np.save(self.folder / "has_title.npy", np.asarray(self._has_title, dtype=bool))
        np.save(self.folder / "id_offsets.npy", np.asarray(self._id_offsets, dtype=np.int64))
        return len(self._title_ends)


class DocStore:
    """Read-only, memory-mapped passages addressed by their row number in the index."""

    def __init__(self, folder: Path) -> None:
        root = folder / DOCS_DIR
        try:
            # plain ndarray views of the maps: same pages, but slicing skips np.memmap's per-slice subclass work
            self._text_offsets: NDArray[np.int64] = _map_array(root / "text_offsets.npy")
            self._title_ends: NDArray[np.int64] = _map_array(root / "title_ends.npy")
            self._has_title: NDArray[np.bool_] = _map_array(root / "has_title.npy")
            self._id_offsets: NDArray[np.int64] = _map_array(root / "id_offsets.npy")
            self._text = _map_bytes(root / "text.bin")
            self._ids = _map_bytes(root / "ids.bin")
        except (OSError, ValueError) as err:
            raise IndexLoadError(f"passage store {root} is missing or corrupt ({err}); rebuild the index") from None
        n = len(self._title_ends)
        consistent = (
            len(self._text_offsets) == n + 1
            and len(self._has_title) == n
            and len(self._id_offsets) == n + 1
            and int(self._text_offsets[-1]) == len(self._text)
            and int(self._id_offsets[-1]) == len(self._ids)
        )
        if not consistent:
            raise IndexLoadError(f"passage store {root} is truncated or inconsistent; rebuild the index")
        self._id_rows: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self._title_ends)

    def doc_id(self, row: int) -> str:
        lo, hi = self._id_offsets[row : row + 2].tolist()
        return self._ids[lo:hi].decode("utf-8")

    def document(self, row: int) -> Document:
        start, end = self._text_offsets[row : row + 2].tolist()
        title_end = int(self._title_ends[row])
        title = self._text[start:title_end].decode("utf-8") if self._has_title[row] else None
        return Document(doc_id=self.doc_id(row), text=self._text[title_end:end].decode("utf-8"), title=title)

    def row_of(self, doc_id: str) -> int:
        """The row of a passage id (the id map is built on first use)."""
        if self._id_rows is None:
            self._id_rows = {self.doc_id(i): i for i in range(len(self))}
        return self._id_rows[doc_id]

    def iter_contents(self, batch_size: int = 10_000) -> Iterator[list[str]]:
        """Batches of indexed text (Search-R1 `contents`), read from the map so memory stays bounded."""
        for lo in range(0, len(self), batch_size):
            yield [self.document(i).contents for i in range(lo, min(lo + batch_size, len(self)))]


def _map_array(path: Path) -> NDArray:
    return np.load(path, mmap_mode="r").view(np.ndarray)


def _map_bytes(path: Path) -> bytes | mmap.mmap:
    """A read-only map of the file (slicing a mmap returns bytes directly, far cheaper than a numpy memmap view)."""
    if path.stat().st_size == 0:
        return b""
    with path.open("rb") as handle:
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def write_docstore(folder: Path, docs: Iterable[Document], source: str = "the corpus") -> int:
    """Stream passages into a new store under `folder/docs`, returning how many were written.

    Raises `CorpusFormatError` when two passages share an id, naming the id and both passages.
    """
    writer = DocStoreWriter(folder)
    try:
        for doc in docs:
            writer.add(doc)
        repeated = writer.repeated_id()
    finally:
        count = writer.close()
    if repeated is not None:
        doc_id, first, second = repeated
        raise CorpusFormatError(
            f"{source}: passage id {doc_id!r} is used by passages {first} and {second} (counting non-blank lines); "
            "ids must be unique, so drop or renumber the duplicate"
        )
    return count
