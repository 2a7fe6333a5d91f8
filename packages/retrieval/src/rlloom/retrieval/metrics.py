"""IR metrics as pure functions over one query's ranked ids and its relevance judgements (trec_eval definitions).

nDCG uses linear gain rel/log2(rank+1) over the ideal ordering of all judged-relevant passages (as pytrec_eval,
which BEIR reports); Recall@k is the share of relevant passages in the top k; MRR@k is 1/rank of the first
relevant one. Answer-hit@k is the QA proxy: some gold answer appears (normalised) in one of the top-k passages.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping, Sequence


def _first_occurrences(ranked: Sequence[str]) -> list[str]:
    """The ranking with repeats dropped (the first rank counts), as a run keyed by id (trec_eval's) holds them."""
    return list(dict.fromkeys(ranked))


def ndcg_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    ranked = _first_occurrences(ranked)
    ideal = sorted((r for r in qrels.values() if r > 0), reverse=True)[:k]
    idcg = sum(rel / math.log2(i + 2) for i, rel in enumerate(ideal))
    if idcg == 0:
        return 0.0
    dcg = sum(qrels.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]) if qrels.get(doc, 0) > 0)
    return dcg / idcg


def recall_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    relevant = {d for d, r in qrels.items() if r > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(_first_occurrences(ranked)[:k])) / len(relevant)


def mrr_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    for i, doc in enumerate(_first_occurrences(ranked)[:k]):
        if qrels.get(doc, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def normalize_answer(text: str) -> str:
    """SQuAD/Search-R1 normalisation: lowercase, drop punctuation and articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def answer_hit_at_k(passages: Sequence[str], answers: Sequence[str], k: int) -> float:
    """1.0 if a normalised gold answer occurs as a whole-word span of a normalised top-k passage, else 0.0."""
    golds = [normalize_answer(a) for a in answers]
    golds = [g for g in golds if g]
    for passage in passages[:k]:
        padded = f" {normalize_answer(passage)} "
        if any(f" {g} " in padded for g in golds):
            return 1.0
    return 0.0


DEFAULT_CUTOFFS = {"ndcg": (10,), "recall": (1, 5, 10, 100), "mrr": (10,)}


def evaluate_run(run: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """Mean of nDCG@10, Recall@{1,5,10,100} and MRR@10 over the judged queries (unjudged ones are skipped)."""
    judged = [q for q in qrels if any(r > 0 for r in qrels[q].values())]
    if not judged:
        raise ValueError("no query has a relevant passage in the qrels; check the qrels file")
    totals: dict[str, float] = {}
    for qid in judged:
        ranked = list(run.get(qid, []))
        for k in DEFAULT_CUTOFFS["ndcg"]:
            totals[f"nDCG@{k}"] = totals.get(f"nDCG@{k}", 0.0) + ndcg_at_k(ranked, qrels[qid], k)
        for k in DEFAULT_CUTOFFS["recall"]:
            totals[f"Recall@{k}"] = totals.get(f"Recall@{k}", 0.0) + recall_at_k(ranked, qrels[qid], k)
        for k in DEFAULT_CUTOFFS["mrr"]:
            totals[f"MRR@{k}"] = totals.get(f"MRR@{k}", 0.0) + mrr_at_k(ranked, qrels[qid], k)
    return {name: total / len(judged) for name, total in totals.items()}
