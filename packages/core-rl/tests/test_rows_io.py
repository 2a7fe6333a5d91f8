"""Row files: JSONL (plain or gzip) read with file:line errors, and written atomically."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rlloom.core_rl.data.rows import DataError, read_jsonl, write_jsonl

ROWS = [{"prompt": "a", "n": 1}, {"prompt": "ü", "n": 2}]


def test_plain_and_gzip_files_read_the_same_rows(tmp_path: Path) -> None:
    text = "\n".join(json.dumps(r) for r in ROWS) + "\n\n"
    (tmp_path / "rows.jsonl").write_text(text, encoding="utf-8")
    with gzip.open(tmp_path / "rows.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(text)
    assert read_jsonl(tmp_path / "rows.jsonl") == ROWS
    assert read_jsonl(tmp_path / "rows.jsonl.gz") == ROWS


def test_a_bad_line_is_named_by_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": \n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"{path}:3: not valid JSON"):
        read_jsonl(path)
    path.write_text('{"prompt": "a"}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"{path}:2: a row must be a JSON object, got list"):
        read_jsonl(path)


def test_writing_is_all_or_nothing(tmp_path: Path) -> None:
    out = tmp_path / "new" / "rows.jsonl"
    assert write_jsonl(out, ROWS) == 2
    assert read_jsonl(out) == ROWS

    def failing() -> object:
        yield {"prompt": "b"}
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        write_jsonl(out, failing())
    assert read_jsonl(out) == ROWS  # the previous file stands
    assert [p.name for p in out.parent.iterdir()] == ["rows.jsonl"]  # no temporary file left behind


def test_files_that_are_not_utf8_jsonl_are_named_with_the_fix(tmp_path: Path) -> None:
    """A veRL parquet file or a broken gzip is a one-line DataError saying how to convert, not a decoder traceback."""
    parquet = tmp_path / "train.parquet"
    parquet.write_bytes(b"PAR1\x15\x04\x15\xff\xfe")
    with pytest.raises(DataError, match=rf"^{parquet}: a parquet file; .*pandas.read_parquet"):
        read_jsonl(parquet)
    binary = tmp_path / "train.jsonl"  # the same bytes under a JSONL name
    binary.write_bytes(b"PAR1\x15\x04\x15\xff\xfe")
    with pytest.raises(DataError, match=rf"^{binary}: not UTF-8 JSONL text .*pandas.read_parquet"):
        read_jsonl(binary)
    broken = tmp_path / "rows.jsonl.gz"
    broken.write_bytes(b'{"prompt": "not gzip"}\n')
    with pytest.raises(DataError, match=rf"^{broken}: not UTF-8 JSONL text"):
        read_jsonl(broken)
