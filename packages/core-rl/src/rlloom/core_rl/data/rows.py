"""Row files on disk: JSONL (gzip too) or parquet (veRL's and Search-R1's format), read with `file:line` (JSONL)
or `file:row N` (parquet) in every error, and written atomically.

Shared by the trainer and the apps' `prepare-data` commands, so a failure never leaves a half-written file and a
bad row is always reported the same way. Parquet needs pyarrow (`pip install 'rlloom-core-rl[parquet]'`).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from rlloom.core_rl.config.keys import ConfigError


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

    def __init__(self, path: Path, rows: Sequence[dict[str, Any]], lines: Sequence[int], unit: str = "") -> None:
        super().__init__(rows)
        self.path = path
        self.lines = list(lines)
        self.unit = unit  # "" for a JSONL line number, "row " for a parquet row number

    def where(self, index: int) -> str:
        return f"{self.path}:{self.unit}{self.lines[index]}"


PARQUET_HINT = (
    "rows are read from JSONL (one JSON object per line, UTF-8, optionally .gz) or from a file named *.parquet "
    "(with pyarrow installed); or convert a veRL parquet file with "
    "`pandas.read_parquet(path).to_json(out, orient='records', lines=True, force_ascii=False)`"
)
PARQUET_INSTALL = "pip install 'rlloom-core-rl[parquet]'"


def _pyarrow(path: Path, doing: str) -> Any:
    """pyarrow and its parquet module, imported on first use (JSONL users never need it)."""
    try:
        import pyarrow  # type: ignore[import-untyped, unused-ignore]
        import pyarrow.parquet  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        needs = f"{doing} it needs pyarrow ({PARQUET_INSTALL})"
        raise DataError(f"{path}: a parquet file; {needs}; {PARQUET_HINT}") from None
    return pyarrow


def read_parquet(path: str | Path) -> JsonlRows:
    """The rows of a parquet file as plain Python values (lists, not numpy arrays); errors name `file:row N`
    (1-based). Nested columns (chat messages, `reward_model`, `extra_info`) come back as lists and dicts."""
    path = Path(path)
    pa = _pyarrow(path, "reading")
    try:
        table = pa.parquet.read_table(path)
    except (OSError, pa.ArrowException) as err:
        raise DataError(f"{path}: a parquet file; pyarrow cannot read it ({err}); {PARQUET_HINT}") from None
    rows = table.to_pylist()
    return JsonlRows(path, rows, range(1, len(rows) + 1), unit="row ")


def plain_value(value: Any) -> Any:
    """`value` with numpy arrays and scalars (what `pandas.read_parquet` rows hold) turned into lists and Python
    numbers, through nested dicts, lists and tuples, so the row can be written as JSON or parquet."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and type(value).__module__ == "numpy":
        return plain_value(tolist())
    if isinstance(value, Mapping):
        return {str(k): plain_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_value(v) for v in value]
    return value


def write_parquet(path: Path, rows: Iterable[Mapping[str, Any]]) -> int:
    """Write `rows` as a parquet file atomically (columns: every key any row has, in order of first appearance;
    a row without a key gets null there); returns how many were written."""
    pa = _pyarrow(path, "writing")
    plain = [plain_value(row) for row in rows]
    columns: dict[str, None] = {}
    for row in plain:
        columns.update(dict.fromkeys(row))
    data = {name: [row.get(name) for row in plain] for name in columns}
    try:
        table = pa.table({name: pa.array(values) for name, values in data.items()})
    except pa.ArrowException as err:
        raise DataError(f"{path}: rows cannot be written as parquet ({err}); each column needs one type") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        try:
            pa.parquet.write_table(table, name)
        except pa.ArrowException as err:
            raise DataError(f"{path}: rows cannot be written as parquet ({err})") from None
        os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)
    return len(plain)


def read_jsonl(path: str | Path) -> JsonlRows:
    """The rows of a JSONL file (blank lines skipped); a line that is not a JSON object raises naming file:line.

    A `.parquet` file is read with `read_parquet` (so every reader of rows takes veRL's and Search-R1's files). A
    file that is not UTF-8 text (parquet without its suffix, a broken gzip) raises a `DataError` saying so,
    rather than a decoder traceback.
    """
    path = Path(path)
    if path.suffix == ".parquet":
        return read_parquet(path)
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
    """Write `rows` as JSONL to `path` atomically (as parquet when `path` ends in `.parquet`); returns how many
    were written."""
    if path.suffix == ".parquet":
        return write_parquet(path, rows)
    count = 0
    with atomic_output(path) as handle:
        for row in rows:
            handle.write(json.dumps(plain_value(row), ensure_ascii=False) + "\n")
            count += 1
    return count
