"""`reasoning train` reads veRL's data.train_files / data.val_files: one file or a list (parquet or JSONL), the rows
concatenated in order, every file checked (exists, has the columns) before torch loads, errors naming the file
(issue 40)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rlloom_apps.reasoning.cli import main
from rlloom_apps.reasoning.train_files import read_data_files, read_rows

from rlloom.core_rl.config import ConfigError
from rlloom.core_rl.data import write_jsonl


def _row(answer: str, source: str = "openai/gsm8k") -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": f"What is {answer}?"}],
        "reward_model": {"ground_truth": answer},
        "data_source": source,
    }


@pytest.fixture
def three_files(tmp_path: Path) -> list[Path]:
    """gsm8k/train.parquet (2 rows), math/train.parquet (1 row), extra.jsonl (2 rows): answers 0..4 in order."""
    files = [tmp_path / "gsm8k" / "train.parquet", tmp_path / "math" / "train.parquet", tmp_path / "extra.jsonl"]
    for path in files[:2]:
        path.parent.mkdir()
    write_jsonl(files[0], [_row("0"), _row("1")])
    write_jsonl(files[1], [_row("2", "math500")])
    write_jsonl(files[2], [_row("3"), _row("4")])
    return files


def _listed(paths: list[Path]) -> str:
    return "[" + ", ".join(f"'{p}'" for p in paths) + "]"


def test_the_files_rows_are_concatenated_in_order_and_errors_name_their_file(three_files: list[Path]) -> None:
    rows = read_rows(three_files)
    assert [row["reward_model"]["ground_truth"] for row in rows] == ["0", "1", "2", "3", "4"]
    assert [row["data_source"] for row in rows] == ["openai/gsm8k"] * 2 + ["math500"] + ["openai/gsm8k"] * 2
    where = [rows.where(i) for i in range(5)]  # type: ignore[attr-defined]
    assert where == [
        f"{three_files[0]}:row 1",
        f"{three_files[0]}:row 2",
        f"{three_files[1]}:row 1",
        f"{three_files[2]}:1",
        f"{three_files[2]}:2",
    ]
    one = read_rows(three_files[2:])
    assert [row["reward_model"]["ground_truth"] for row in one] == ["3", "4"]


def test_data_files_stand_in_for_the_flags(three_files: list[Path]) -> None:
    typed = [f"data.train_files={_listed(three_files[:2])}", f"+data.val_files={three_files[2]}", "actor.lr=1e-6"]
    files = read_data_files(typed, None, None)
    assert (files.train, files.val, files.rest) == (three_files[:2], three_files[2:], ["actor.lr=1e-6"])
    assert files.labelled() == {
        "data.train_files[0]": three_files[0],
        "data.train_files[1]": three_files[1],
        "--val-data": three_files[2],
    }
    assert files.mapped[0] == (typed[0], f"--train-data {three_files[0]}, {three_files[1]}")
    same = read_data_files([f"data.train_files={three_files[0]}"], three_files[0], None)  # the same file twice
    assert same.train == three_files[:1]
    flags = read_data_files([], three_files[0], three_files[2])  # --train-data still works
    assert (flags.train, flags.val, flags.mapped) == (three_files[:1], three_files[2:], [])


@pytest.mark.parametrize(
    ("typed", "flag", "message"),
    [
        (["data.train_files=[]"], None, "data.train_files=[]: expected a file path or a list of them"),
        (["data.val_files=3"], "a.jsonl", "data.val_files=3: expected a file path or a list of them"),
        (["data.train_files=b.jsonl"], "a.jsonl", "--train-data a.jsonl and data.train_files=['b.jsonl'] disagree"),
        ([], None, "train needs --train-data FILE (or veRL's data.train_files=FILE or a list of files)"),
    ],
)
def test_bad_data_files_are_refused_naming_the_key(typed: list[str], flag: str | None, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        read_data_files(typed, None if flag is None else Path(flag), None)
    assert message in str(err.value)


def test_dry_run_reads_every_file(three_files: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    main(["train", "--dry-run", f"data.train_files={_listed(three_files[:2])}", f"data.val_files={three_files[2]}"])
    out = capsys.readouterr().out
    assert f"# train data: {three_files[0]}, {three_files[1]} (rows checked)" in out
    assert f"# val data: {three_files[2]}" in out
    assert f"#   mapped:  data.train_files={_listed(three_files[:2])} -> --train-data" in out


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    return capsys.readouterr().err


def test_a_missing_file_is_named(three_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gone = tmp_path / "math" / "test.parquet"
    err = _refused(["train", "--dry-run", f"data.train_files={_listed([three_files[0], gone])}"], capsys)
    assert f"data.train_files[1] {gone} does not exist (make rows with `reasoning prepare-data`)" in err


def test_a_file_without_the_columns_is_named(
    three_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare.parquet"
    write_jsonl(bare, [{"question": "What is 2?", "answer": "2"}])  # a raw dataset, not prepare-data's rows
    err = _refused(["train", "--dry-run", f"data.train_files={_listed([three_files[0], bare])}"], capsys)
    want = (
        f"data.train_files[1] {bare} lacks the column(s) prompt (or prompt_ids), data_source (it has: answer, question)"
    )
    assert want in err


def test_a_bad_row_in_the_second_file_names_it(
    three_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps(_row("5")) + "\n" + json.dumps(_row("6", "gsm8kk")) + "\n")
    err = _refused(["train", "--dry-run", f"data.train_files={_listed([three_files[0], odd])}"], capsys)
    assert f"{odd}:2" in err and "gsm8kk" in err
