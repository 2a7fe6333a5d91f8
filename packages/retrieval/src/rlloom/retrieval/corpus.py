"""Reading passage corpora line by line: Search-R1 JSONL (`id`, `contents`) and BEIR JSONL (`_id`, `title`, `text`).

Both formats may be gzip-compressed (`.gz`). Reading streams: a 21M-passage wiki-18 file is never held in memory.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rlloom.retrieval.types import CorpusFormatError


@dataclass(frozen=True, slots=True)
class Document:
    """One passage as stored: its id, optional title and body text."""

    doc_id: str
    text: str
    title: str | None = None

    @property
    def contents(self) -> str:
        """Search-R1's `contents` string (`"Title"\\ntext`), also the text every backend indexes."""
        return f'"{self.title}"\n{self.text}' if self.title is not None else self.text


def open_text(path: Path) -> IO[str]:
    """Open a UTF-8 text file, transparently decompressing `.gz` (checked by magic bytes, not only the suffix)."""
    with path.open("rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return path.open(encoding="utf-8")


def split_contents(contents: str) -> tuple[str | None, str]:
    """Split Search-R1 `contents` into (title, text): the first line is the title when it is wrapped in quotes."""
    first, sep, rest = contents.partition("\n")
    if sep and len(first) >= 2 and first.startswith('"') and first.endswith('"'):
        return first[1:-1], rest
    return None, contents


def parse_document(row: dict[str, object], where: str) -> Document:
    """Turn one decoded JSON line into a Document, accepting either corpus format."""
    if "contents" in row:
        doc_id = row.get("id", row.get("_id"))
        title, text = split_contents(_string(row, "contents", where))
        # a separate `title` field wins over the quoted first line (pyserini-style JsonCollection rows)
        if isinstance(row.get("title"), str) and title is None:
            title = str(row["title"])
    elif "text" in row:
        doc_id = row.get("_id", row.get("id"))
        text = _string(row, "text", where)
        raw_title = row.get("title")
        title = str(raw_title) if isinstance(raw_title, str) and raw_title != "" else None
    else:
        raise CorpusFormatError(
            f"{where}: a passage needs `contents` (Search-R1 JSONL) or `text` (BEIR JSONL); found keys {sorted(row)}"
        )
    if doc_id is None or isinstance(doc_id, (dict, list)):
        raise CorpusFormatError(f"{where}: missing passage id; add an `id` (Search-R1) or `_id` (BEIR) field")
    return Document(doc_id=str(doc_id), text=text, title=title)


def _string(row: dict[str, object], key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str):
        raise CorpusFormatError(f"{where}: field `{key}` must be a string, got {type(value).__name__}")
    return value


def check_corpus_file(path: Path) -> None:
    """A corpus is one file; a folder (say a BEIR download) gets a message pointing at the file inside it."""
    if path.is_dir():
        inside = sorted(path.glob("corpus.jsonl*"))
        hint = f", e.g. {inside[0]}" if inside else ""
        raise IsADirectoryError(
            f"corpus {path} is a folder; give the corpus file (a Search-R1 or BEIR JSONL(.gz) file){hint}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} does not exist; pass a Search-R1 or BEIR JSONL(.gz) file")


def read_corpus(path: str | Path) -> Iterator[Document]:
    """Yield the corpus's passages in file order; blank lines are skipped, malformed ones raise with the line number."""
    path = Path(path)
    check_corpus_file(path)
    with open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise CorpusFormatError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(row, dict):
                raise CorpusFormatError(f"{where}: each line must be a JSON object, got {type(row).__name__}")
            yield parse_document(row, where)


def file_checksum(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 of the corpus file's bytes, recorded in the manifest so an index can be matched to its corpus."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
