import argparse
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from rlloom.retrieval.cli import _parser, main
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


def test_build_index_never_replaces_a_folder_of_other_files(
    tmp_path: Path, search_r1_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "notes.txt").write_text("precious\n")
    assert main(["build-index", "--corpus", str(search_r1_corpus), "--out", str(scratch)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {scratch} is a folder that holds other files" in err
    assert "new or empty folder" in err
    assert sorted(p.name for p in scratch.iterdir()) == ["notes.txt"]
    assert (scratch / "notes.txt").read_text() == "precious\n"
    # an old index at --out is still replaced
    index = tmp_path / "idx"
    assert main(["build-index", "--corpus", str(search_r1_corpus), "--out", str(index), "--opt", "k1=0.9"]) == 0
    assert main(["build-index", "--corpus", str(search_r1_corpus), "--out", str(index), "--opt", "k1=0.8"]) == 0
    assert load_index(index).manifest.params["k1"] == 0.8


def test_build_time_opts_are_refused_by_serve_and_eval(
    tmp_path: Path, hotpot: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("serve started a server despite --opt k1=3")

    monkeypatch.setattr(uvicorn, "run", started)
    index = tmp_path / "idx"
    assert main(["build-index", "--corpus", str(hotpot / "corpus.jsonl"), "--out", str(index)]) == 0
    capsys.readouterr()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    assert main(["serve", "--index", str(index), "--port", port, "--opt", "k1=3"]) == 2
    captured = capsys.readouterr()
    assert "k1 is fixed when the index is built" in captured.err and "build-index" in captured.err
    assert "serving" not in captured.out
    queries = ["--queries", str(hotpot / "queries.jsonl"), "--answers"]
    assert main(["eval", "--index", str(index), *queries, "--opt", "method=foo"]) == 2
    assert "method is fixed when the index is built" in capsys.readouterr().err
    assert main(["eval", "--index", str(index), *queries, "--backend", "dense"]) == 2
    assert "--backend only applies with --corpus" in capsys.readouterr().err
    assert main(["eval", "--index", str(index), *queries, "--opt", "n_threads=1"]) == 0  # query-time: allowed


def test_option_errors_are_one_line(tmp_path: Path, hotpot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = ["--corpus", str(hotpot / "corpus.jsonl")]
    assert main(["build-index", *corpus, "--out", str(tmp_path / "x"), "--opt", "stemmer=klingon"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stemmer='klingon'" in err and "english" in err
    dense = ["--backend", "dense", "--opt", "model=sentence-transformers/all-MiniLM-L6-v2"]
    assert main(["build-index", *corpus, "--out", str(tmp_path / "x"), *dense]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a folder; models load from a local path" in err
    assert main(["build-index", "--corpus", str(hotpot), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a folder; give the corpus file" in err and "does not exist" not in err
    assert not (tmp_path / "x").exists()


def _layouts(hotpot: Path, tmp_path: Path) -> dict[str, Path]:
    """The hotpot slice's questions rewritten in the QA layouts the project uses."""
    rows = [json.loads(line) for line in (hotpot / "queries.jsonl").read_text().splitlines()]
    nq = tmp_path / "nq.jsonl"
    nq.write_text("".join(json.dumps({"question": r["text"], "answer": r["metadata"]["answers"]}) + "\n" for r in rows))
    prepared = tmp_path / "prepared.jsonl"
    prepared.write_text(
        "".join(
            json.dumps(
                {
                    "data_source": "hotpotqa",
                    "prompt": [{"role": "user", "content": f"... Question: {r['text']}\n"}],
                    "reward_model": {"style": "rule", "ground_truth": {"target": r["metadata"]["answers"]}},
                    "extra_info": {"index": i, "split": "test", "question": r["text"]},
                }
            )
            + "\n"
            for i, r in enumerate(rows)
        )
    )
    as_list = tmp_path / "dev_qa_simplified.json"
    as_list.write_text(json.dumps([{"question": r["text"], "answer": r["metadata"]["answers"][0]} for r in rows]))
    return {"nq-open": nq, "prepare-data": prepared, "json-list": as_list}


@pytest.mark.parametrize("layout", ["nq-open", "prepare-data", "json-list"])
def test_eval_answers_reads_the_project_qa_layouts(
    layout: str, tmp_path: Path, hotpot: Path, hotpot_bm25: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _layouts(hotpot, tmp_path)[layout]
    assert main(["eval", "--index", str(hotpot_bm25.path), "--queries", str(path), "--answers"]) == 0
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines()[1:])
    rows = [json.loads(line) for line in (hotpot / "queries.jsonl").read_text().splitlines()]
    hits = hotpot_bm25.search([r["text"] for r in rows], 20)
    for k in (1, 3, 5, 10, 20):
        expected = sum(
            answer_hit_at_k([h.contents for h in hs], r["metadata"]["answers"], k)
            for hs, r in zip(hits, rows, strict=True)
        ) / len(rows)
        assert float(printed[f"AnswerHit@{k}"]) == pytest.approx(expected, abs=1e-4)
    assert float(printed["AnswerHit@20"]) == 1.0  # every answer is in its 10 contexts


def test_eval_warns_about_qrels_documents_missing_from_the_index(
    tmp_path: Path, hotpot: Path, hotpot_bm25: Any, search_r1_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    qrels = tmp_path / "qrels.tsv"
    lines = (hotpot / "qrels" / "test.tsv").read_text().splitlines()
    qrels.write_text("\n".join([*lines, lines[1].split("\t")[0] + "\tnot-a-doc\t1", ""]))
    queries = ["--queries", str(hotpot / "queries.jsonl"), "--qrels", str(qrels)]
    assert main(["eval", "--index", str(hotpot_bm25.path), *queries]) == 0
    captured = capsys.readouterr()
    assert "WARNING: 1 of 11 documents" in captured.err and "not-a-doc" in captured.err
    assert "nDCG@10" in captured.out
    other = tmp_path / "other"
    assert main(["build-index", "--corpus", str(search_r1_corpus), "--out", str(other)]) == 0
    capsys.readouterr()
    assert main(["eval", "--index", str(other), *queries]) == 2
    assert "none of the 11 documents in the qrels is in the index" in capsys.readouterr().err


def test_search_through_a_running_server(
    live_server: Any, hotpot_bm25: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    query = "Kiss and Tell Corliss Archer"
    assert main(["search", query, "--index", str(hotpot_bm25.path), "-k", "3"]) == 0
    local = capsys.readouterr().out
    expected = [h.doc_id for h in hotpot_bm25.search([query], 3)[0]]
    assert _ids(local) == expected and len(expected) == 3
    for api in ("native", "search-r1"):
        assert main(["search", query, "--url", live_server.url, "--api", api, "-k", "3"]) == 0
        assert capsys.readouterr().out == local  # same hits, scores and text as the local index
    assert main(["search", query, "--url", "http://127.0.0.1:9", "-k", "3"]) == 2
    assert "unreachable" in capsys.readouterr().err


def _ids(printed: str) -> list[str]:
    return [line.split("[", 1)[1].split(" | ")[0].rstrip("]") for line in printed.splitlines() if "] score=" in line]


def test_serve_refuses_a_busy_port_before_announcing(hotpot_bm25: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--index", str(hotpot_bm25.path), "--port", str(port)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and f"--port {port}" in captured.err and "in use" in captured.err


def test_every_flag_has_a_help_text_and_shows_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "argparse" not in top and "build an index folder" in top and "examples:" in top
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) == {"build-index", "import-faiss", "import-lucene", "serve", "search", "eval"}
    for name, sub in commands.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.dest} has no help"
            if action.default not in (None, False) and not action.required:
                shown = "none" if action.default == [] else str(action.default)
                assert f"(default: {shown})" in action.help % {"default": action.default}, (name, action.dest)


def test_a_shortened_flag_is_refused_not_taken_as_the_flag_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse would read `--ap native` as `--api native`; a prefix must be refused (exit 2), naming what was given."""
    with pytest.raises(SystemExit) as exit_info:
        main(["search", "q", "--index", str(tmp_path), "--ap", "native"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --ap native" in capsys.readouterr().err
