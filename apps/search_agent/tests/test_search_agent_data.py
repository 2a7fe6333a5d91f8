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
