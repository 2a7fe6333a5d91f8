"""Running a retriever over a BEIR query set (qrels) or a QA set (answers) and averaging the metrics."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from pydantic import BaseModel
from tqdm.auto import tqdm

from rlloom.retrieval.corpus import open_text
from rlloom.retrieval.metrics import answer_hit_at_k, evaluate_run
from rlloom.retrieval.types import Retriever


class Query(BaseModel):
    qid: str
    text: str
    answers: list[str] = []


def read_queries(path: str | Path) -> list[Query]:
    """BEIR `queries.jsonl` (`_id`, `text`, `metadata.answers`) or QA JSONL (`id`, `question`, `golden_answers`)."""
    out = []
    with open_text(Path(path)) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            qid = row.get("_id", row.get("id", str(number)))
            text = row.get("text", row.get("question"))
            if not isinstance(text, str):
                raise ValueError(f"{path}:{number}: a query needs a `text` (BEIR) or `question` (QA) string")
            metadata = row.get("metadata") or {}
            answers = metadata.get("answers") or row.get("golden_answers") or row.get("answers") or []
            if isinstance(answers, str):
                answers = [answers]
            out.append(Query(qid=str(qid), text=text, answers=[str(a) for a in answers]))
    return out


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """BEIR qrels TSV (`query-id`, `corpus-id`, `score`, with a header) or TREC (`qid 0 docid rel`)."""
    qrels: dict[str, dict[str, int]] = {}
    with open_text(Path(path)) as handle:
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
        raise ValueError("no query carries answers (`metadata.answers` or `golden_answers`); use --qrels instead")
    run = run_queries(retriever, with_answers, k=max(ks))
    out = {}
    for k in ks:
        hits = [answer_hit_at_k([c for _, c in run[q.qid]], q.answers, k) for q in with_answers]
        out[f"AnswerHit@{k}"] = sum(hits) / len(hits)
    return out
