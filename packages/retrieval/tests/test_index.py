import json
from pathlib import Path

import bm25s
import pytest

from rlloom.retrieval import __version__
from rlloom.retrieval.corpus import file_checksum
from rlloom.retrieval.index import build_index, load_index
from rlloom.retrieval.manifest import MANIFEST
from rlloom.retrieval.types import CorpusFormatError, IndexLoadError


@pytest.fixture
def built(tmp_path: Path, search_r1_corpus: Path) -> Path:
    return build_index(search_r1_corpus, tmp_path / "index", k1=0.9, b=0.4)


def test_manifest_records_what_was_built(built: Path, search_r1_corpus: Path) -> None:
    manifest = json.loads((built / MANIFEST).read_text())
    assert manifest["backend"] == "bm25"
    assert manifest["params"]["k1"] == 0.9 and manifest["params"]["b"] == 0.4
    assert manifest["doc_count"] == 10
    assert manifest["corpus_sha256"] == file_checksum(search_r1_corpus)
    assert manifest["versions"]["rlloom-retrieval"] == __version__
    assert manifest["versions"]["bm25s"] == bm25s.__version__
    assert "docs/text.bin" in manifest["files"]


def test_loaded_index_finds_the_passage(built: Path) -> None:
    hit = load_index(built).search(["Genentech lobbyist Evan Morris"], k=1)[0][0]
    assert (hit.doc_id, hit.title) == ("0", "Evan Morris")


def test_missing_folder_and_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(IndexLoadError, match="does not exist"):
        load_index(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexLoadError, match="has no manifest.json"):
        load_index(tmp_path / "empty")


def test_corrupt_manifest(built: Path) -> None:
    (built / MANIFEST).write_text("{ not json")
    with pytest.raises(IndexLoadError, match="corrupt"):
        load_index(built)


def test_future_format_version_is_refused(built: Path) -> None:
    manifest = json.loads((built / MANIFEST).read_text())
    manifest["format_version"] = 99
    (built / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(IndexLoadError, match="format_version 99"):
        load_index(built)


def test_truncated_index_file_is_detected(built: Path) -> None:
    data = next((built / "bm25").glob("data.csc.index.npy"))
    data.write_bytes(data.read_bytes()[:-8])
    with pytest.raises(IndexLoadError, match="modified or truncated"):
        load_index(built)


def test_index_from_another_corpus_is_refused(built: Path, hotpot: Path, search_r1_corpus: Path) -> None:
    assert load_index(built, corpus=search_r1_corpus).manifest.doc_count == 10
    with pytest.raises(IndexLoadError, match="built from a corpus with sha256"):
        load_index(built, corpus=hotpot / "corpus.jsonl")


def test_unknown_backend_and_bad_options_name_the_problem(tmp_path: Path, search_r1_corpus: Path) -> None:
    with pytest.raises(ValueError, match="unknown backend 'tfidf'"):
        build_index(search_r1_corpus, tmp_path / "x", backend="tfidf")
    with pytest.raises(ValueError, match="k1"):
        build_index(search_r1_corpus, tmp_path / "x", k1=-1)
    with pytest.raises(ValueError, match="k_one"):
        build_index(search_r1_corpus, tmp_path / "x", k_one=1.0)


def test_failed_rebuild_leaves_the_old_index(built: Path, tmp_path: Path) -> None:
    before = {p.relative_to(built): p.read_bytes() for p in built.rglob("*") if p.is_file()}
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "a", "contents": "fine"}\n{"id": "b", "contents": "also fine"}\n{"id": oops}\n')
    with pytest.raises(CorpusFormatError, match="broken.jsonl:3"):
        build_index(broken, built)
    after = {p.relative_to(built): p.read_bytes() for p in built.rglob("*") if p.is_file()}
    assert after == before
    assert load_index(built).manifest.doc_count == 10
    assert not [p for p in built.parent.iterdir() if p.name.startswith(".")]  # no temp folder left behind


def test_successful_rebuild_replaces_the_index(built: Path, hotpot: Path) -> None:
    build_index(hotpot / "corpus.jsonl", built)
    assert load_index(built).manifest.doc_count == 50
    assert not [p for p in built.parent.iterdir() if p.name.startswith(".")]


def test_empty_corpus_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="holds no passages"):
        build_index(empty, tmp_path / "idx")
    assert not (tmp_path / "idx").exists()


def test_build_refuses_a_folder_that_is_not_an_index(tmp_path: Path, search_r1_corpus: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "notes.txt").write_text("precious")
    with pytest.raises(FileExistsError, match=r"out_dir .*scratch is a folder that holds other files.*new or empty"):
        build_index(search_r1_corpus, scratch)
    assert [p.name for p in scratch.iterdir()] == ["notes.txt"]
    assert (scratch / "notes.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scratch"]  # no temp folder left behind
    a_file = tmp_path / "file.txt"
    a_file.write_text("keep")
    with pytest.raises(FileExistsError, match="is an existing file"):
        build_index(search_r1_corpus, a_file)
    assert a_file.read_text() == "keep"


def test_build_into_an_empty_folder(tmp_path: Path, search_r1_corpus: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert load_index(build_index(search_r1_corpus, tmp_path / "empty")).manifest.doc_count == 10


def test_build_time_options_are_refused_at_load(built: Path) -> None:
    with pytest.raises(ValueError, match=r"^k1 is fixed when the index is built \(.* has k1=0.9\).*--opt k1=3"):
        load_index(built, k1=3)
    with pytest.raises(ValueError, match=r"method, stemmer are fixed when the index is built"):
        load_index(built, method="atire", stemmer="english")
    with pytest.raises(ValueError, match="unknown option 'k_one'"):
        load_index(built, k_one=1.0)
    # a query-time field still applies, and changes nothing about the scores
    query = ["Genentech lobbyist Evan Morris"]
    assert load_index(built, n_threads=1).search(query, 3) == load_index(built).search(query, 3)


def test_unknown_stemmer_is_a_one_line_error_listing_the_valid_ones(tmp_path: Path, search_r1_corpus: Path) -> None:
    with pytest.raises(ValueError) as err:
        build_index(search_r1_corpus, tmp_path / "x", stemmer="klingon")
    message = str(err.value)
    assert "\n" not in message
    assert "stemmer='klingon'" in message and "english" in message and "porter" in message
    assert not (tmp_path / "x").exists()


def test_dense_model_must_be_a_local_folder(tmp_path: Path, search_r1_corpus: Path) -> None:
    # refused while validating options, before any encoder (or network) is touched
    with pytest.raises(ValueError, match=r"all-MiniLM-L6-v2' is not a folder; models load from a local path"):
        build_index(search_r1_corpus, tmp_path / "x", backend="dense", model="sentence-transformers/all-MiniLM-L6-v2")
    with pytest.raises(ValueError, match=r"hybrid part 'second': .*not a folder"):
        build_index(
            search_r1_corpus,
            tmp_path / "x",
            backend="hybrid",
            first={"backend": "bm25"},
            second={"backend": "dense", "model": "intfloat/e5-base-v2"},
        )
    with pytest.raises(ValueError, match="has no config.json"):
        build_index(search_r1_corpus, tmp_path / "x", backend="dense", model=str(tmp_path))
    assert not (tmp_path / "x").exists()


def test_a_corpus_folder_points_at_the_file_inside(tmp_path: Path, hotpot: Path) -> None:
    with pytest.raises(IsADirectoryError, match=r"is a folder; give the corpus file .*e\.g\. .*corpus\.jsonl"):
        build_index(hotpot, tmp_path / "x")
