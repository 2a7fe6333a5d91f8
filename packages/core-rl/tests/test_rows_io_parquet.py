"""Parquet rows (veRL's and Search-R1's format): read as plain Python values, written atomically, and every error
names the file (and the row)."""

from __future__ import annotations

import builtins
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from rlloom.core_rl.data.rows import DataError, plain_value, read_jsonl, read_parquet, write_jsonl, write_parquet

np = pytest.importorskip("numpy")

# Search-R1's nq_search.py row layout: chat prompt, nested reward_model / extra_info
ROWS: list[dict[str, Any]] = [
    {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": "Answer the given question. Question: who wrote hamlet?\n"}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["William Shakespeare", "Shakespeare"]}},
        "extra_info": {"split": "train", "index": 0},
    },
    {
        "data_source": "hotpotqa",
        "prompt": [{"role": "user", "content": "Question: é ünïcode?\n"}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["yes"]}},
        "extra_info": {"split": "train", "index": 1},
    },
]


def test_plain_value_turns_numpy_into_python() -> None:
    # what pandas.read_parquet(...).to_dict("records") gives for the rows above
    row = {"reward_model": {"ground_truth": {"target": np.array(["a", "b"], dtype=object)}}, "n": np.int64(3)}
    row["prompt"] = np.array([{"role": "user", "content": "q"}], dtype=object)
    assert plain_value(row) == {
        "reward_model": {"ground_truth": {"target": ["a", "b"]}},
        "n": 3,
        "prompt": [{"role": "user", "content": "q"}],
    }
    assert type(plain_value(row)["n"]) is int
    assert json.dumps(plain_value(row))  # JSON-serialisable


def test_round_trip_keeps_nested_messages_and_golds(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    out = tmp_path / "train.parquet"
    assert write_parquet(out, ROWS) == 2
    back = read_parquet(out)
    assert list(back) == ROWS and back.where(1) == f"{out}:row 2"
    assert read_jsonl(out) == ROWS  # every reader of rows takes a .parquet file
    # rows as pandas gives them (numpy arrays inside) write the same file content
    numpy_rows = [
        {**r, "prompt": np.array(r["prompt"], dtype=object), "extra_info": {**r["extra_info"], "index": np.int64(i)}}
        for i, r in enumerate(ROWS)
    ]
    assert write_jsonl(tmp_path / "again.parquet", numpy_rows) == 2  # write_jsonl picks parquet by the suffix
    assert list(read_parquet(tmp_path / "again.parquet")) == ROWS
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_pyarrow_reads_it_as_search_r1_reads_its_files(tmp_path: Path) -> None:
    """The file written is ordinary parquet: pyarrow's own reader sees the columns and nested values."""
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "test.parquet"
    write_parquet(out, ROWS)
    table = pq.read_table(out)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert table.column("reward_model").to_pylist()[0]["ground_truth"]["target"] == [
        "William Shakespeare",
        "Shakespeare",
    ]


def test_a_column_of_mixed_types_is_refused_naming_the_file(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    out = tmp_path / "bad.parquet"
    with pytest.raises(DataError, match=rf"^{out}: rows cannot be written as parquet"):
        write_parquet(out, [{"a": 1}, {"a": "x"}])
    assert not out.exists()


def test_a_broken_parquet_file_is_one_line_error(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    broken = tmp_path / "train.parquet"
    broken.write_bytes(b"PAR1\x15\x04\x15\xff\xfe")
    with pytest.raises(DataError, match=rf"^{broken}: a parquet file; pyarrow cannot read it"):
        read_jsonl(broken)


def test_without_pyarrow_the_error_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_pyarrow(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(
        DataError, match=r"a parquet file; reading it needs pyarrow \(pip install 'rlloom-core-rl\[parquet\]'\)"
    ):
        read_parquet(path)
    with pytest.raises(DataError, match=r"writing it needs pyarrow"):
        write_parquet(tmp_path / "out.parquet", ROWS)
