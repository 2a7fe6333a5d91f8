"""Search-R1's data format: `prepare-data` reads FlashRAG/Search-R1 parquet and writes parquet, and the rows it
writes are read back by `train`/`eval`'s reader unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlloom_apps.search_agent.cli import main
from rlloom_apps.search_agent.data import read_rows, search_r1_prompt

pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")

# FlashRAG's layout (Search-R1's nq_search.py reads RUC-NLPIR/FlashRAG_datasets): id, question, golden_answers
RAW = [
    {"id": "test_0", "question": "who wrote hamlet", "golden_answers": ["William Shakespeare", "Shakespeare"]},
    {"id": "test_1", "question": "capital of france?", "golden_answers": ["Paris"]},
]


def test_prepare_data_parquet_in_and_out(tmp_path: Path) -> None:
    raw = tmp_path / "nq_test.parquet"
    pq.write_table(pa.Table.from_pylist(RAW), raw)
    jsonl, parquet = tmp_path / "rows.jsonl", tmp_path / "rows.parquet"
    for out in (jsonl, parquet):
        argv = ["prepare-data", "--data-source", "nq", "--input", str(raw), "--out", str(out)]
        assert main(argv) in (0, None)
    from_jsonl = [json.loads(line) for line in jsonl.read_text().splitlines()]
    from_parquet = read_rows(parquet, "--data")
    assert from_parquet == from_jsonl == read_rows(jsonl, "--data")
    assert [r["reward_model"]["ground_truth"]["target"] for r in from_parquet] == [r["golden_answers"] for r in RAW]
    assert from_parquet[0]["prompt"] == [{"role": "user", "content": search_r1_prompt("who wrote hamlet")}]
    # the columns Search-R1's own RLHFDataset reads from its parquet files
    names = pq.read_table(parquet).column_names
    assert {"data_source", "prompt", "reward_model", "extra_info"} <= set(names)


def test_a_bad_parquet_row_names_file_and_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = tmp_path / "raw.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q", "golden_answers": ["a"]}, {"question": "q2"}]), raw)
    with pytest.raises(SystemExit):
        main(["prepare-data", "--data-source", "nq", "--input", str(raw), "--out", str(tmp_path / "o.parquet")])
    assert f"--input {raw}: record 1 has no answer" in capsys.readouterr().err  # pyarrow's null, as missing
    assert not (tmp_path / "o.parquet").exists()
