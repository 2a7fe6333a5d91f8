import json
from pathlib import Path

import pytest
from rlloom_apps.reasoning.cli import main
from rlloom_apps.reasoning.data import gsm8k_final_answer, to_row

GSM8K_RECORD = {
    "question": "Janet has 3 apples and buys 1,200 more. How many?",
    "answer": "3 + 1200 = <<3+1200=1203>>1203\n#### 1,203",
}


def test_gsm8k_final_answer_strips_thousands_separator() -> None:
    assert gsm8k_final_answer(GSM8K_RECORD["answer"]) == "1203"


def test_gsm8k_without_marker_is_an_error() -> None:
    with pytest.raises(ValueError, match="####"):
        gsm8k_final_answer("the answer is 4")


def test_row_shape_matches_verl() -> None:
    row = to_row("gsm8k", GSM8K_RECORD, 7, "test")
    assert row["data_source"] == "gsm8k"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "1203"}
    assert row["extra_info"] == {"index": 7, "split": "test", "solution": "3 + 1200 = <<3+1200=1203>>1203"}
    assert row["prompt"][0]["role"] == "user"
    assert row["prompt"][0]["content"].startswith("Janet has 3 apples")
    assert "\\boxed{}" in row["prompt"][0]["content"]


def test_missing_field_is_named() -> None:
    with pytest.raises(ValueError, match="'problem'"):
        to_row("math500", {"answer": "3"}, 0, "test")


def test_cli_writes_rows(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(
        json.dumps({"problem": "What is $1+1$?", "answer": "2"})
        + "\n\n"
        + json.dumps({"problem": "Simplify $\\frac{2}{4}$.", "answer": "\\frac{1}{2}"})
        + "\n"
    )
    out = tmp_path / "rows.jsonl"
    main(["prepare-data", "--dataset", "math500", "--input", str(source), "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", "\\frac{1}{2}"]
    assert [r["extra_info"]["index"] for r in rows] == [0, 1]


def test_prepared_aime_rows_are_scored_by_the_math_checker(tmp_path: Path) -> None:
    from rlloom.rewards.batch import score_batch

    source = tmp_path / "aime24_gkv.jsonl"  # the layout of shared/data/aime24/aime24_gkv.jsonl: question/answer
    source.write_text("".join(json.dumps({"question": f"Problem {n}?", "answer": str(n)}) + "\n" for n in (70, 588)))
    for dataset in ("aime24", "aime25"):
        out = tmp_path / f"{dataset}.jsonl"
        main(["prepare-data", "--dataset", dataset, "--input", str(source), "--out", str(out)])
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        items = [
            {"response": f"so \\boxed{{{r['reward_model']['ground_truth']}}}", "data_source": r["data_source"],
             "ground_truth": r["reward_model"]["ground_truth"]}
            for r in rows
        ]  # fmt: skip
        assert [(r.score, r.error) for r in score_batch(items, workers=0)] == [(1.0, None)] * 2


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()  # prepare-data's usage (wrapped) + one error line
    assert lines[0].startswith("usage: reasoning prepare-data ") and all(line.startswith(" ") for line in lines[1:-1])
    assert lines[-1].startswith("reasoning prepare-data: error: ")
    return lines[-1]


def _refused_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dataset: str, record: dict[str, object]
) -> tuple[Path, Path, str]:
    """prepare-data on a one-record input file: (the input, the output that must not appear, the error line)."""
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(record) + "\n")
    out = tmp_path / "rows.jsonl"
    return (
        source,
        out,
        _refused(["prepare-data", "--dataset", dataset, "--input", str(source), "--out", str(out)], capsys),
    )


def test_prepare_data_mistakes_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    math500 = tmp_path / "math500.jsonl"
    math500.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n{oops\n")
    out = tmp_path / "rows.jsonl"

    def prep(*extra: str) -> list[str]:
        return ["prepare-data", "--out", str(out), *extra]

    line = _refused(prep("--dataset", "gsm8k", "--input", str(math500)), capsys)
    assert str(math500) in line and "no field 'question'" in line and "'question' and 'answer'" in line
    assert str(broken) + ":2" in _refused(prep("--dataset", "gsm8k", "--input", str(broken)), capsys)
    assert "is a folder; give the file" in _refused(prep("--dataset", "gsm8k", "--input", str(tmp_path)), capsys)
    assert "--limit must be 0 or more" in _refused(
        prep("--dataset", "math500", "--input", str(math500), "--limit", "-1"), capsys
    )
    no_final = tmp_path / "no_final.jsonl"  # the second record's answer lacks GSM8K's '#### <number>' line
    no_final.write_text("\n".join(json.dumps({"question": "q", "answer": a}) for a in ("#### 1", "It is 2")) + "\n")
    line = _refused(prep("--dataset", "gsm8k", "--input", str(no_final)), capsys)
    assert f"--input {no_final}:2: the GSM8K answer has no '#### <number>' final line" in line
    assert "is --dataset right for this file?" in line
    assert not out.exists()  # no partial or empty output was left behind by any failure
    assert list(tmp_path.glob(".rows.jsonl.*")) == []
    line = _refused(["prepare-data", "--dataset", "math500", "--input", str(math500), "--out", str(tmp_path)], capsys)
    assert line.endswith(f"--out {tmp_path} is a folder; give a file path, e.g. {tmp_path / 'math500.jsonl'}")
    kept = math500.read_bytes()
    line = _refused(["prepare-data", "--dataset", "math500", "--input", str(math500), "--out", str(math500)], capsys)
    assert line.endswith(f"--out {math500} is the --input file; it would be overwritten: give another path")
    assert math500.read_bytes() == kept


def test_prepare_data_reads_gzip(tmp_path: Path) -> None:
    import gzip

    source = tmp_path / "test.jsonl.gz"
    with gzip.open(source, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"question": "Two apples and one more?", "answer": "2 + 1 = 3\n#### 3"}) + "\n")
    out = tmp_path / "rows.jsonl"
    main(["prepare-data", "--dataset", "gsm8k", "--input", str(source), "--out", str(out)])
    assert json.loads(out.read_text())["reward_model"]["ground_truth"] == "3"


def test_a_failure_keeps_the_previous_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.jsonl"
    out.write_text("earlier rows\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n" + json.dumps({"problem": "x"}) + "\n")
    _refused(["prepare-data", "--dataset", "math500", "--input", str(bad), "--out", str(out)], capsys)
    assert out.read_text() == "earlier rows\n"


@pytest.mark.parametrize(
    ("dataset", "record", "message"),
    [
        ("math500", {"problem": "1+1?", "answer": None}, "its 'answer' is not text or a number (None)"),
        ("aime24", {"problem": "1+1?", "answer": True}, "its 'answer' is not text or a number (True)"),
        ("math500", {"problem": "1+1?", "answer": "  "}, "has an empty answer"),
        ("gsm8k", {"question": "1+1?", "answer": "1 + 1 = 2\n#### "}, "has an empty answer"),
        ("math500", {"problem": " ", "answer": "2"}, "has an empty or non-text 'problem'"),
    ],
)
def test_null_or_empty_fields_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dataset: str, record: dict[str, object], message: str
) -> None:
    """A null answer used to become the gold "None", which the math checker matches to a \\boxed{None} reply."""
    source, out, line = _refused_record(tmp_path, capsys, dataset, record)
    assert f"--input {source}:1: {dataset} record 0" in line and message in line and "fix or drop the record" in line
    assert not out.exists()
    source.write_text(json.dumps({"problem": "Find n.", "answer": 204}) + "\n")  # AIME answers may be numbers
    main(["prepare-data", "--dataset", "aime24", "--input", str(source), "--out", str(out)])
    assert json.loads(out.read_text())["reward_model"]["ground_truth"] == "204"


@pytest.mark.parametrize(
    ("dataset", "record", "message"),
    [
        ("mbpp", {"task_id": 11, "text": "Write f.", "test_list": None}, "'test_list' must be a non-empty list"),
        # a bare string used to become one "test" per character
        ("mbpp", {"task_id": 11, "text": "Write f.", "test_list": "assert f(1) == 1"}, "list of assert strings"),
        ("mbpp", {"task_id": 11, "text": None, "test_list": ["assert f(1) == 1"]}, "empty or non-text 'text'"),
        ("humaneval", {"prompt": "def f():\n", "test": None, "entry_point": "f"}, "empty or non-text 'test'"),
    ],
)
def test_code_records_without_usable_tests_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dataset: str, record: dict[str, object], message: str
) -> None:
    source, out, line = _refused_record(tmp_path, capsys, dataset, record)
    assert f"--input {source}:1: {dataset} record 0" in line and message in line
    assert not out.exists()
