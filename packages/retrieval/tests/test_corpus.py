import gzip
import json
from pathlib import Path

import pytest

from rlloom.retrieval import build_index
from rlloom.retrieval.corpus import Document, read_corpus, split_contents
from rlloom.retrieval.docstore import DocStore, write_docstore
from rlloom.retrieval.types import CorpusFormatError, IndexLoadError


def test_search_r1_rows_split_title_from_text(search_r1_corpus: Path) -> None:
    docs = list(read_corpus(search_r1_corpus))
    raw = [json.loads(line) for line in search_r1_corpus.read_text().splitlines()]
    assert len(docs) == len(raw) == 10
    assert docs[0].doc_id == "0" and docs[0].title == "Evan Morris"
    assert docs[0].text.startswith("Evan Morris Evan L. Morris")
    # the Search-R1 `contents` string is reproduced byte for byte
    assert [d.contents for d in docs] == [r["contents"] for r in raw]


def test_beir_rows_and_gzip_give_the_same_documents(tmp_path: Path, hotpot: Path) -> None:
    plain = hotpot / "corpus.jsonl"
    packed = tmp_path / "corpus.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    docs = list(read_corpus(plain))
    assert docs == list(read_corpus(packed))
    first = json.loads(plain.read_text().splitlines()[0])
    assert docs[0] == Document(doc_id=first["_id"], text=first["text"], title=first["title"])


def test_split_contents_only_takes_a_quoted_first_line() -> None:
    assert split_contents('"T"\nbody') == ("T", "body")
    assert split_contents("no title\nbody") == (None, "no title\nbody")
    assert split_contents('"only line"') == (None, '"only line"')


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('["a"]', "must be a JSON object"),
        ('{"title": "x"}', "needs `contents`"),
        ('{"contents": "x"}', "missing passage id"),
        ('{"id": 1, "contents": 5}', "field `contents` must be a string"),
    ],
)
def test_malformed_lines_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "contents": "ok"}\n\n' + line + "\n")
    with pytest.raises(CorpusFormatError, match=message) as info:
        list(read_corpus(path))
    assert f"{path}:3" in str(info.value)


def test_docstore_round_trip_keeps_text_once(tmp_path: Path) -> None:
    docs = [
        Document("a", "plain text", None),
        Document("β-id", "ünïcödé body ✓", "Tïtle"),
        Document("empty", "", ""),
    ]
    assert write_docstore(tmp_path, docs) == 3
    store = DocStore(tmp_path)
    assert [store.document(i) for i in range(3)] == docs
    assert store.row_of("β-id") == 1
    raw = sum(len(d.text.encode()) + len((d.title or "").encode()) for d in docs)
    assert (tmp_path / "docs" / "text.bin").stat().st_size == raw


def test_truncated_docstore_is_reported(tmp_path: Path) -> None:
    write_docstore(tmp_path, [Document("a", "some text", "T")])
    with (tmp_path / "docs" / "text.bin").open("r+b") as handle:
        handle.truncate(3)
    with pytest.raises(IndexLoadError, match="truncated or inconsistent"):
        DocStore(tmp_path)


def test_repeated_passage_ids_are_refused_naming_both_passages(tmp_path: Path) -> None:
    corpus = tmp_path / "dup.jsonl"
    rows = [{"id": "7", "contents": "alpha"}, {"id": "8", "contents": "beta"}, {"id": "7", "contents": "gamma"}]
    corpus.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(CorpusFormatError, match=r"dup\.jsonl: passage id '7' is used by passages 1 and 3"):
        build_index(corpus, tmp_path / "idx")
    assert not (tmp_path / "idx").exists()
    # ids that differ only past a common prefix, or in their bytes, are not repeats
    unique = [Document("1", "a"), Document("11", "b"), Document("ü", "c"), Document("u", "d")]
    assert write_docstore(tmp_path / "ok", unique) == 4
