import math

import numpy as np
import pytest

from rlloom.retrieval.hybrid import reciprocal_rank_fusion, weighted_score_fusion
from rlloom.retrieval.metrics import (
    answer_hit_at_k,
    evaluate_run,
    mrr_at_k,
    ndcg_at_k,
    normalize_answer,
    recall_at_k,
)
from rlloom.retrieval.ranking import Ranking

QRELS = {"a": 1, "c": 1, "x": 0}


def test_ndcg_by_hand() -> None:
    # relevant at ranks 2 and 4 of ["b", "a", "d", "c"]; ideal puts both at ranks 1 and 2
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    idcg = 1 / math.log2(2) + 1 / math.log2(3)
    assert ndcg_at_k(["b", "a", "d", "c"], QRELS, 10) == pytest.approx(dcg / idcg)
    assert ndcg_at_k(["b", "a", "d", "c"], QRELS, 2) == pytest.approx((1 / math.log2(3)) / idcg)
    assert ndcg_at_k(["a", "c"], QRELS, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["x", "y"], QRELS, 10) == 0.0


def test_graded_ndcg_uses_linear_gain() -> None:
    qrels = {"a": 2, "b": 1}
    got = ndcg_at_k(["b", "a"], qrels, 10)
    assert got == pytest.approx((1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3)))


def test_recall_and_mrr_by_hand() -> None:
    ranked = ["b", "a", "d", "c"]
    assert recall_at_k(ranked, QRELS, 1) == 0.0
    assert recall_at_k(ranked, QRELS, 2) == 0.5
    assert recall_at_k(ranked, QRELS, 4) == 1.0
    assert mrr_at_k(ranked, QRELS, 10) == 0.5
    assert mrr_at_k(ranked, QRELS, 1) == 0.0


def test_evaluate_run_averages_judged_queries() -> None:
    run = {"q1": ["a", "b"], "q2": ["z"], "q3": ["a"]}
    qrels = {"q1": {"a": 1}, "q2": {"y": 1}, "q3": {"a": 0}}  # q3 has no relevant passage: skipped
    scores = evaluate_run(run, qrels)
    assert scores["Recall@1"] == 0.5 and scores["MRR@10"] == 0.5 and scores["nDCG@10"] == 0.5
    assert set(scores) == {"nDCG@10", "Recall@1", "Recall@5", "Recall@10", "Recall@100", "MRR@10"}
    with pytest.raises(ValueError, match="no query has a relevant passage"):
        evaluate_run(run, {"q3": {"a": 0}})


def test_answer_hit_matches_normalised_whole_words() -> None:
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    passages = ["Paris is in France.", "It was built by Gustave Eiffel in 1889"]
    assert answer_hit_at_k(passages, ["1889"], 1) == 0.0
    assert answer_hit_at_k(passages, ["1889"], 2) == 1.0
    assert answer_hit_at_k(passages, ["the France"], 1) == 1.0
    assert answer_hit_at_k(passages, ["Pari"], 2) == 0.0  # no partial-word matches
    assert answer_hit_at_k(passages, ["", "the"], 2) == 0.0  # empty answers never match


def _r(rows: list[int], scores: list[float]) -> Ranking:
    return Ranking(np.asarray(rows, dtype=np.int64), np.asarray(scores, dtype=np.float32))


def test_reciprocal_rank_fusion_by_hand() -> None:
    first, second = _r([1, 2, 3], [9, 8, 7]), _r([3, 1, 4], [0.9, 0.5, 0.1])
    fused = reciprocal_rank_fusion([first, second], (1.0, 1.0), rrf_k=60, k=4)
    expected = {1: 1 / 61 + 1 / 62, 2: 1 / 62, 3: 1 / 63 + 1 / 61, 4: 1 / 63}
    order = sorted(expected, key=lambda r: -expected[r])
    assert fused.rows.tolist() == order
    assert fused.scores.tolist() == pytest.approx([expected[r] for r in order])


def test_weighted_fusion_min_max_normalises_each_part() -> None:
    first, second = _r([1, 2, 3], [10, 5, 0]), _r([3, 1], [2.0, 1.0])
    fused = weighted_score_fusion([first, second], (0.7, 0.3), k=3)
    expected = {1: 0.7 * 1.0 + 0.3 * 0.0, 2: 0.7 * 0.5, 3: 0.7 * 0.0 + 0.3 * 1.0}
    assert fused.rows.tolist() == [1, 2, 3]
    assert fused.scores.tolist() == pytest.approx([expected[1], expected[2], expected[3]])


def test_a_repeated_id_in_a_run_counts_once() -> None:
    # a run keyed by id (trec_eval, pytrec_eval) cannot hold a passage twice; the first rank is the one that counts
    qrels = {"d1": 1, "d2": 1}
    assert ndcg_at_k(["d1", "d1", "d2"], qrels, 3) == pytest.approx(1.0)
    # top 2 after dropping the repeat: x, d2 -> DCG 1/log2(3); ideal 1 + 1/log2(3)
    expected = (1 / math.log2(3)) / (1 + 1 / math.log2(3))
    assert ndcg_at_k(["x", "x", "d2"], qrels, 2) == pytest.approx(expected)
    assert recall_at_k(["x", "x", "d2"], qrels, 2) == 0.5
    assert mrr_at_k(["x", "x", "d2"], qrels, 2) == 0.5
