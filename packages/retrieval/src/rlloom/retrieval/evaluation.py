"""Running a retriever over a BEIR query set (qrels) or a QA set (answers) and averaging the metrics."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from tqdm.auto import tqdm

from rlloom.retrieval.corpus import open_text
from rlloom.retrieval.metrics import answer_hit_at_k, evaluate_run
from rlloom.retrieval.types import Retriever


class Query(BaseModel):
    qid: str
    text: str
    answers: list[str] = []


QUERY_LAYOUTS = (
    'BEIR queries.jsonl ({"_id", "text", "metadata": {"answers": [...]}}); '
    'QA JSONL ({"id"?, "question", "answer" | "answers" | "golden_answers"}, e.g. NQ-open); '
    "`search-agent prepare-data` rows (extra_info.question or question, reward_model.ground_truth.target); "
    "or a JSON list of such objects (e.g. HotpotQA's dev_qa_simplified.json)"
)
ANSWER_FIELDS = "metadata.answers, golden_answers, answers, answer or reward_model.ground_truth.target"


def read_queries(path: str | Path) -> list[Query]:
    """Queries (and gold answers when present) from any layout in `QUERY_LAYOUTS`, JSONL(.gz) or a JSON list."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"queries {path} is a folder; give the queries file ({QUERY_LAYOUTS})")
    if not path.is_file():
        raise FileNotFoundError(f"queries file {path} does not exist; accepted layouts: {QUERY_LAYOUTS}")
    with open_text(path) as handle:
        text = handle.read()
    return [parse_query(row, where, qid) for row, where, qid in _rows(text, path)]


def _rows(text: str, path: Path) -> list[tuple[Any, str, str]]:
    """(decoded row, location for messages, fallback id) per query: JSON-list position or JSONL line number."""
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not a valid JSON list ({err.msg} at line {err.lineno})") from None
        return [(row, f"{path}[{i}]", str(i)) for i, row in enumerate(items)]
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((json.loads(line), f"{path}:{number}", str(number)))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not valid JSON ({err.msg}); accepted: {QUERY_LAYOUTS}") from None
    return rows


def parse_query(row: Any, where: str, fallback_id: str) -> Query:
    """One query row of any accepted layout; `where` (file:line) prefixes errors."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a query must be a JSON object, got {type(row).__name__}; accepted: {QUERY_LAYOUTS}")
    extra = _object(row, "extra_info")
    text = next((t for t in (row.get("text"), row.get("question"), extra.get("question")) if isinstance(t, str)), None)
    if text is None:
        raise ValueError(f"{where}: no query text (keys {sorted(row)}); accepted layouts: {QUERY_LAYOUTS}")
    qid = next((q for q in (row.get("_id"), row.get("id"), extra.get("index")) if q is not None), fallback_id)
    return Query(qid=str(qid), text=text, answers=_answers(row))


def _object(row: dict[str, Any], key: str) -> dict[str, Any]:
    value = row.get(key)
    return value if isinstance(value, dict) else {}


def _answers(row: dict[str, Any]) -> list[str]:
    metadata = _object(row, "metadata")
    truth = _object(row, "reward_model").get("ground_truth")
    if isinstance(truth, dict):
        truth = truth.get("target")
    for value in (metadata.get("answers"), row.get("golden_answers"), row.get("answers"), row.get("answer"), truth):
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if isinstance(value, list) and value:
            return [str(a) for a in value]
    return []


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """BEIR qrels TSV (`query-id`, `corpus-id`, `score`, with a header) or TREC (`qid 0 docid rel`)."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder; give the qrels file inside it" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"qrels {path} {what} (BEIR `qrels/test.tsv` or TREC `qid 0 docid rel`)")
    qrels: dict[str, dict[str, int]] = {}
    with open_text(path) as handle:
        for number, row in enumerate(csv.reader(handle, delimiter="\t"), start=1):
            if len(row) == 1:
                row = row[0].split()
            if not row or (number == 1 and row[0] == "query-id"):
                continue
            if len(row) == 3:
                qid, doc, rel = row
            elif len(row) == 4:
                qid, _, doc, rel = row
            else:
                raise ValueError(f"{path}:{number}: expected `query-id corpus-id score` (3 or 4 columns), got {row}")
            qrels.setdefault(qid, {})[doc] = int(float(rel))
    return qrels


def run_queries(
    retriever: Retriever, queries: list[Query], k: int, batch_size: int = 256
) -> dict[str, list[tuple[str, str]]]:
    """qid -> ranked (doc_id, contents) for every query, searched in batches with a progress bar."""
    run: dict[str, list[tuple[str, str]]] = {}
    for lo in tqdm(range(0, len(queries), batch_size), desc="eval: searching", unit="batch"):
        batch = queries[lo : lo + batch_size]
        for query, hits in zip(batch, retriever.search([q.text for q in batch], k), strict=True):
            run[query.qid] = [(h.doc_id, h.contents) for h in hits]
    return run


def check_qrels_documents(qrels: dict[str, dict[str, int]], has_document: Callable[[str], bool]) -> list[str]:
    """The qrels' document ids that the index lacks; raises when it holds none (qrels of another corpus)."""
    judged = sorted({doc for docs in qrels.values() for doc in docs})
    missing = [doc for doc in judged if not has_document(doc)]
    if judged and len(missing) == len(judged):
        raise ValueError(
            f"none of the {len(judged)} documents in the qrels is in the index (e.g. {', '.join(judged[:3])}): "
            "the qrels belong to another corpus; build the index from the corpus the qrels were written for"
        )
    return missing


def evaluate_qrels(retriever: Retriever, queries: list[Query], qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    judged = [q for q in queries if q.qid in qrels]
    if not judged:
        raise ValueError("no query id appears in the qrels; check that queries and qrels belong together")
    run = run_queries(retriever, judged, k=100)
    return evaluate_run({qid: [d for d, _ in hits] for qid, hits in run.items()}, qrels)


def evaluate_answers(
    retriever: Retriever, queries: list[Query], ks: tuple[int, ...] = (1, 3, 5, 10, 20)
) -> dict[str, float]:
    with_answers = [q for q in queries if q.answers]
    if not with_answers:
        raise ValueError(f"no query carries answers (looked for {ANSWER_FIELDS}); accepted layouts: {QUERY_LAYOUTS}")
    contexts = [
        [h.contents for h in hits]
        for lo in tqdm(range(0, len(with_answers), 256), desc="eval: searching", unit="batch")
        for hits in retriever.search([q.text for q in with_answers[lo : lo + 256]], max(ks))
    ]  # by position, not id: QA files often have no ids, or repeat them
    out = {}
    for k in ks:
        hits = [answer_hit_at_k(c, q.answers, k) for c, q in zip(contexts, with_answers, strict=True)]
        out[f"AnswerHit@{k}"] = sum(hits) / len(hits)
    return out
