import json
from pathlib import Path

import pytest
from rlloom_apps.search_agent.cli import main
from rlloom_apps.search_agent.data import answers_of, search_r1_prompt, to_row


def test_prompt_appends_question_mark_and_keeps_tags() -> None:
    prompt = search_r1_prompt("who wrote he ain't heavy he's my brother lyrics")
    assert prompt.endswith("Question: who wrote he ain't heavy he's my brother lyrics?\n")
    for tag in ("<think>", "<search> query </search>", "<information>", "<answer> Beijing </answer>"):
        assert tag in prompt


def test_question_mark_not_doubled() -> None:
    assert search_r1_prompt("Is it?").endswith("Question: Is it?\n")


def test_aliases_from_list_and_string() -> None:
    assert answers_of({"answer": ["Bobby Scott", "Bob Russell"]}, 0) == ["Bobby Scott", "Bob Russell"]
    assert answers_of({"answer": "yes"}, 0) == ["yes"]
    with pytest.raises(ValueError, match="record 3"):
        answers_of({"question": "q"}, 3)
    with pytest.raises(ValueError, match="empty"):
        answers_of({"answer": [""]}, 1)


def test_row_ground_truth_is_search_r1_target() -> None:
    row = to_row("nq", {"question": "q", "answer": ["a", "b"]}, 5, "dev")
    assert row["reward_model"]["ground_truth"] == {"target": ["a", "b"]}
    assert row["data_source"] == "nq"


def test_cli_reads_json_list_and_jsonl(tmp_path: Path) -> None:
    listed = tmp_path / "hotpot.json"
    listed.write_text(json.dumps([{"question": "Were A and B the same?", "answer": "yes", "type": "comparison"}]))
    lines = tmp_path / "nq.jsonl"
    lines.write_text(json.dumps({"question": "when", "answer": ["1972"]}) + "\n")
    for source, name in ((listed, "hotpotqa"), (lines, "nq")):
        out = tmp_path / f"{name}.rows.jsonl"
        main(["prepare-data", "--data-source", name, "--input", str(source), "--out", str(out)])
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        assert len(rows) == 1 and rows[0]["data_source"] == name


def test_beir_queries_and_ircot_records_are_read(tmp_path: Path) -> None:
    # the two layouts of shared/data/hotpotqa (beir_style_from_ircot500/queries.jsonl, the IRCoT jsonl), by hand
    beir = {"_id": "5a8c", "text": "Who was Chief of Protocol", "metadata": {"answers": ["Shirley Temple"]}}
    ircot = {"question_id": "5a8c", "question_text": "Who was Chief of Protocol?",
             "answers_objects": [{"number": "", "spans": ["Shirley Temple", "Shirley Temple Black"]}]}  # fmt: skip
    for name, record, golds in (
        ("beir", beir, ["Shirley Temple"]),
        ("ircot", ircot, ["Shirley Temple", "Shirley Temple Black"]),
    ):
        source = tmp_path / f"{name}.jsonl"
        source.write_text(json.dumps(record) + "\n")
        out = tmp_path / f"{name}_rows.jsonl"
        main(["prepare-data", "--data-source", "hotpotqa", "--input", str(source), "--out", str(out)])
        row = json.loads(out.read_text())
        assert row["reward_model"]["ground_truth"] == {"target": golds}
        assert row["extra_info"]["question"].rstrip("?") == "Who was Chief of Protocol"
        assert row["prompt"][0]["content"].rstrip().endswith("Question: Who was Chief of Protocol?")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"query": "q", "answer": "a"}\n', "has no question: expected 'question'"),
        ('{"question": "q"}\n', "has no answer"),
        ('{"question": "q", "answer": "a"}\n{broken\n', "in.jsonl:2: not valid JSON"),
        ('[{"question": "q", "answer": "a"},\n oops]\n', "in.jsonl:2: not valid JSON"),
    ],
)
def test_prepare_data_mistakes_are_one_line_errors(
    tmp_path: Path, content: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "rows.jsonl"
    source.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare-data", "--data-source", "nq", "--input", str(source), "--out", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_prepare_data_refuses_folders_and_negative_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"question": "q", "answer": "a"}\n')
    for argv, message in (
        (["--input", str(tmp_path), "--out", str(tmp_path / "o.jsonl")], "is a folder; give the file"),
        (["--input", str(source), "--out", str(tmp_path)], "--out"),
        (["--input", str(source), "--out", str(tmp_path / "o.jsonl"), "--limit", "-2"], "--limit must be 0 or more"),
    ):
        with pytest.raises(SystemExit):
            main(["prepare-data", "--data-source", "nq", *argv])
        assert message in capsys.readouterr().err


def test_prepare_data_reads_gzip(tmp_path: Path) -> None:
    import gzip

    source = tmp_path / "in.jsonl.gz"
    with gzip.open(source, "wt", encoding="utf-8") as handle:
        handle.write('{"question": "who wrote hamlet", "answer": ["Shakespeare"]}\n')
    main(["prepare-data", "--data-source", "nq", "--input", str(source), "--out", str(tmp_path / "o.jsonl")])
    assert json.loads((tmp_path / "o.jsonl").read_text())["reward_model"]["ground_truth"] == {"target": ["Shakespeare"]}


def test_odd_answers_are_read_as_text_or_refused() -> None:
    assert answers_of({"answer": 1972}, 0) == ["1972"]  # a year stored as a number is its text
    assert answers_of({"answer": [3.0, 2.5]}, 0) == ["3", "2.5"]
    assert answers_of({"answer": None, "answers": ["x"]}, 0) == ["x"]  # an explicit null does not hide 'answers'
    for bad in ([1972, None], {"a": 1}, True):  # would have become golds "None", "a" or crashed
        with pytest.raises(ValueError, match="record 4 has an answer that is not text or a number"):
            answers_of({"answer": bad}, 4)


def test_empty_question_is_refused() -> None:
    for question in ("", "   "):
        with pytest.raises(ValueError, match="record 2 has an empty question"):
            to_row("nq", {"question": question, "answer": ["x"]}, 2, "test")


def test_out_equal_to_input_is_refused_and_the_input_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "nq.jsonl"
    raw = json.dumps({"question": "when", "answer": ["1972"]}) + "\n"
    source.write_text(raw)
    with pytest.raises(SystemExit):
        main(["prepare-data", "--data-source", "nq", "--input", str(source), "--out", str(tmp_path / "." / "nq.jsonl")])
    assert "is the --input file" in capsys.readouterr().err
    assert source.read_text() == raw


def test_empty_input_and_prepared_rows_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(SystemExit):
        main(["prepare-data", "--data-source", "nq", "--input", str(empty), "--out", str(tmp_path / "out.jsonl")])
    assert "holds no records" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
    prepared = tmp_path / "rows.jsonl"
    prepared.write_text(json.dumps(to_row("nq", {"question": "q", "answer": "a"}, 0, "test")) + "\n")
    with pytest.raises(SystemExit):
        main(["prepare-data", "--data-source", "nq", "--input", str(prepared), "--out", str(tmp_path / "again.jsonl")])
    assert "looks like a prepared row" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["prepare-data", "train", "eval"])
def test_parquet_and_binary_files_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # Search-R1 ships train.parquet/test.parquet: they gave a bare "'utf-8' codec can't decode" (train) or a
    # traceback (eval), without the file's name or what to do
    parquet = tmp_path / "train.parquet"
    parquet.write_bytes(b"PAR1\x15\x04\xff\xfe\x00binary")
    binary = tmp_path / "rows.jsonl"
    binary.write_bytes(parquet.read_bytes())
    for path, expected in ((parquet, "a parquet file"), (binary, "not UTF-8 JSONL or JSON text")):
        argv = {
            "prepare-data": ["prepare-data", "--data-source", "nq", "--input", str(path), "--out", str(tmp_path / "o")],
            "train": ["train", "--train-data", str(path), "--retrieval-url", "http://127.0.0.1:9", "model.path=/no"],
            "eval": ["eval", "--data", str(path), "--method", "direct", "--model", "/no/model"],
        }[command]
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert f"error: {path}: {expected}" in err and "pandas.read_parquet" in err, err
