"""Row files on disk: JSONL read with `file:line` in every error (gzip too), and written atomically.

Shared by the trainer and the apps' `prepare-data` commands, so a failure never leaves a half-written file and a
bad line is always reported the same way.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from rlloom.core_rl.config_keys import ConfigError


def open_text(path: Path) -> IO[str]:
    """A UTF-8 text file, or a gzip-compressed one (`.gz`), for reading."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


class DataError(ConfigError):
    """Training or validation rows that cannot be used (or whose rewards all fail); the message names the row
    (file:line when known) and the field. A `ConfigError`, so the apps report it as one line."""


class JsonlRows(list[dict[str, Any]]):
    """Rows read from a JSONL file that remember their line, so errors about a row can say `file:line`."""

    def __init__(self, path: Path, rows: Sequence[dict[str, Any]], lines: Sequence[int]) -> None:
        super().__init__(rows)
        self.path = path
        self.lines = list(lines)

    def where(self, index: int) -> str:
        return f"{self.path}:{self.lines[index]}"


PARQUET_HINT = (
    "rows are read from JSONL (one JSON object per line, UTF-8, optionally .gz); convert a veRL parquet file with "
    "`pandas.read_parquet(path).to_json(out, orient='records', lines=True, force_ascii=False)`"
)


def read_jsonl(path: str | Path) -> JsonlRows:
    """The rows of a JSONL file (blank lines skipped); a line that is not a JSON object raises naming file:line.

    A file that is not UTF-8 text (a veRL parquet file, a broken gzip) raises a `DataError` saying what to convert
    it to, rather than a decoder traceback.
    """
    path = Path(path)
    if path.suffix == ".parquet":
        raise DataError(f"{path}: a parquet file; {PARQUET_HINT}")
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    try:
        with open_text(path) as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{path}:{number}: not valid JSON ({err.msg}); one JSON object per line") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{number}: a row must be a JSON object, got {type(row).__name__}")
                rows.append(row)
                lines.append(number)
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise DataError(f"{path}: not UTF-8 JSONL text ({err}); {PARQUET_HINT}") from None
    return JsonlRows(path, rows, lines)


@contextmanager
def atomic_output(path: Path) -> Iterator[IO[str]]:
    """Write to a temporary file beside `path`, renamed to `path` only when the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
        os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)


def write_jsonl(path: Path, rows: Iterable[Any]) -> int:
    """Write `rows` as JSONL to `path` atomically; returns how many were written."""
    count = 0
    with atomic_output(path) as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count
