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
    assert row["extra_info"] == {"index": 7, "split": "test"}
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
