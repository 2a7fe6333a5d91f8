import json
from pathlib import Path

import pytest

from rlloom.retrieval.cli import main
from rlloom.retrieval.evaluation import read_qrels, read_queries
from rlloom.retrieval.index import load_index
from rlloom.retrieval.metrics import answer_hit_at_k, evaluate_run


def test_build_search_and_eval(tmp_path: Path, hotpot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "idx"
    assert main(["build-index", "--corpus", str(hotpot / "corpus.jsonl"), "--out", str(out), "--opt", "k1=0.9"]) == 0
    index = load_index(out)
    assert index.manifest.params["k1"] == 0.9
    capsys.readouterr()

    assert main(["search", "Kiss and Tell Corliss Archer", "--index", str(out), "-k", "2"]) == 0
    printed = capsys.readouterr().out
    assert "  1. [" in printed and "  2. [" in printed and "Kiss and Tell" in printed

    assert (
        main(
            [
                "eval",
                "--index",
                str(out),
                "--queries",
                str(hotpot / "queries.jsonl"),
                "--qrels",
                str(hotpot / "qrels" / "test.tsv"),
            ]
        )
        == 0
    )
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines()[1:])
    queries = read_queries(hotpot / "queries.jsonl")
    run = {
        q.qid: [h.doc_id for h in hits]
        for q, hits in zip(queries, index.search([q.text for q in queries], 100), strict=True)
    }
    expected = evaluate_run(run, read_qrels(hotpot / "qrels" / "test.tsv"))
    assert {k: float(v) for k, v in printed.items()} == pytest.approx(expected, abs=1e-4)


def test_eval_answers_builds_from_a_corpus(hotpot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "eval",
                "--corpus",
                str(hotpot / "corpus.jsonl"),
                "--queries",
                str(hotpot / "queries.jsonl"),
                "--answers",
                "--opt",
                "stemmer=english",
            ]
        )
        == 0
    )
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines()[1:])
    assert set(printed) == {"AnswerHit@1", "AnswerHit@3", "AnswerHit@5", "AnswerHit@10", "AnswerHit@20"}
    values = [float(printed[f"AnswerHit@{k}"]) for k in (1, 3, 5, 10, 20)]
    assert values == sorted(values) and values[-1] == 1.0  # every answer is somewhere in its 10 contexts
    rows = [json.loads(line) for line in (hotpot / "queries.jsonl").read_text().splitlines()]
    assert answer_hit_at_k(["x"], rows[0]["metadata"]["answers"], 1) == 0.0


def test_errors_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "q", "--index", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["build-index", "--corpus", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"id": "1", "contents": "x"}\n')
    assert main(["build-index", "--corpus", str(bad), "--out", str(tmp_path / "o"), "--opt", "nope=1"]) == 2
    assert "nope" in capsys.readouterr().err
