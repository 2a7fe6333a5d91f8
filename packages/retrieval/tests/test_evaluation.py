"""Reading the QA and qrels files the project uses, and the qrels/index consistency check."""

import json
from pathlib import Path

import pytest

from rlloom.retrieval.evaluation import Query, check_qrels_documents, read_qrels, read_queries

# questions and gold answers, written below in each layout `eval --answers` must read
QUESTIONS = [
    ("Who portrayed Corliss Archer in the film Kiss and Tell?", ["Chief of Protocol"]),
    ("Which is older, A or B?", ["A", "the first one"]),
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_nq_open_rows_answer_field(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "nq.jsonl", [{"question": q, "answer": a} for q, a in QUESTIONS])
    assert read_queries(path) == [
        Query(qid="1", text=QUESTIONS[0][0], answers=["Chief of Protocol"]),
        Query(qid="2", text=QUESTIONS[1][0], answers=["A", "the first one"]),
    ]


def test_search_agent_prepare_data_rows(tmp_path: Path) -> None:
    # the row layout of apps/search_agent's `prepare-data` (data.py: to_row)
    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": f"Answer the given question. ... Question: {q}?\n"}],
            "reward_model": {"style": "rule", "ground_truth": {"target": a}},
            "extra_info": {"index": i, "split": "test", "question": q},
        }
        for i, (q, a) in enumerate(QUESTIONS)
    ]
    flat = {"question": "a flat question", "reward_model": {"ground_truth": {"target": [7]}}}
    path = _write_jsonl(tmp_path / "prepared.jsonl", [*rows, flat])
    assert read_queries(path) == [
        Query(qid="0", text=QUESTIONS[0][0], answers=["Chief of Protocol"]),
        Query(qid="1", text=QUESTIONS[1][0], answers=["A", "the first one"]),
        Query(qid="3", text="a flat question", answers=["7"]),
    ]


def test_json_list_file_like_hotpotqa_simplified(tmp_path: Path) -> None:
    path = tmp_path / "dev_qa_simplified.json"
    path.write_text(json.dumps([{"question": q, "answer": a[0], "type": "bridge"} for q, a in QUESTIONS]))
    assert read_queries(path) == [
        Query(qid="0", text=QUESTIONS[0][0], answers=["Chief of Protocol"]),
        Query(qid="1", text=QUESTIONS[1][0], answers=["A"]),
    ]


def test_beir_and_golden_answers_still_read(hotpot: Path, tmp_path: Path) -> None:
    first = read_queries(hotpot / "queries.jsonl")[0]
    assert (first.qid, first.answers) == ("5a8c7595554299585d9e36b6", ["Chief of Protocol"])
    path = _write_jsonl(tmp_path / "flashrag.jsonl", [{"id": "q7", "question": "x", "golden_answers": ["y"]}])
    assert read_queries(path) == [Query(qid="q7", text="x", answers=["y"])]


def test_unreadable_rows_list_the_accepted_layouts(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"question": "ok"}, {"query": "no"}])
    with pytest.raises(ValueError, match=r"bad.jsonl:2: no query text .*BEIR queries.jsonl.*NQ-open.*prepare-data"):
        read_queries(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"bad.jsonl\[0\]: a query must be a JSON object"):
        read_queries(path)
    with pytest.raises(IsADirectoryError, match="is a folder"):
        read_queries(tmp_path)


def test_qrels_documents_missing_from_the_index(hotpot: Path) -> None:
    qrels = read_qrels(hotpot / "qrels" / "test.tsv")
    in_index = {doc for docs in qrels.values() for doc in docs}
    assert check_qrels_documents(qrels, in_index.__contains__) == []
    known = sorted(in_index)[3:]
    assert check_qrels_documents(qrels, set(known).__contains__) == sorted(in_index)[:3]
    with pytest.raises(ValueError, match="none of the 10 documents in the qrels is in the index"):
        check_qrels_documents(qrels, lambda doc: False)
