"""Benchmark rlloom.rewards.math against Math-Verify, measured in the same run.

Three parts:
1. accuracy on ../shared/data/answer_check_dev (hendrycks pairs, xVerify examples, GSM8K labelled model
   solutions) and on the package's hand-labelled set; a labelled holdout set is reported as measurement only;
2. throughput: responses/s over 5,000 MATH-style CoT responses built from MATH-500 solutions (right and wrong
   final answers), single process and with a 2-worker pool, as a ratio to Math-Verify in a loop;
3. worst-case latency: p99 and max of one `score` over adversarial inputs.

Run: .venv/bin/python bench/rewards.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rlloom.rewards.math import is_equivalent, score

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DEV = SHARED / "data" / "answer_check_dev"
HANDLABELLED = ROOT / "packages" / "rewards" / "tests" / "data" / "math_handlabelled.jsonl"
TIMEOUT = 3.0


# ---------------------------------------------------------------- Math-Verify, called as its README suggests
def mv_score(response: str, gold: str) -> float:
    """Math-Verify reward: parse gold (wrapped in $ so bare LaTeX is read) and the response, then verify."""
    from math_verify import parse, verify

    gold_parsed = parse(gold if "\\boxed" in gold or "$" in gold else f"${gold}$", parsing_timeout=None)
    if not gold_parsed:
        gold_parsed = parse(gold, parsing_timeout=None)
    answer = parse(response, parsing_timeout=None)
    return float(verify(gold_parsed, answer, timeout_seconds=None))


def mv_equivalent(pred: str, gold: str) -> bool:
    """Math-Verify on a bare answer pair: both sides wrapped in $...$ as math."""
    return mv_score(f"${pred}$", gold) == 1.0


# ---------------------------------------------------------------- accuracy sets
def _jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_sets(quick: bool) -> dict[str, list[tuple[str, str, bool, str]]]:
    """name -> list of (response_or_pred, gold, label, kind) where kind is "pair" or "response"."""
    sets: dict[str, list[tuple[str, str, bool, str]]] = {}
    sets["hendrycks pairs"] = [
        (r["pred"], r["gold"], bool(r["is_correct"]), "pair")
        for r in _jsonl(DEV / "hendrycks_math_equivalence_test_pairs.jsonl")
    ]
    xverify = json.loads((DEV / "xverify_eval_examples.json").read_text(encoding="utf-8"))
    sets["xVerify examples"] = [
        (x["llm_output"], x["correct_answer"], x["human_judgment_result"] == "Correct", "response") for x in xverify
    ]
    gsm = _jsonl(DEV / "gsm8k_model_solutions_pairs.jsonl")
    if quick:
        gsm = random.Random(0).sample(gsm, 400)
    sets["GSM8K model solutions"] = [(r["response"], r["gold"], bool(r["is_correct"]), "response") for r in gsm]
    if HANDLABELLED.exists():
        sets["hand-labelled"] = [
            (
                r["response"] if "response" in r else r["pred"],
                r["gold"],
                bool(r["label"]),
                "response" if "response" in r else "pair",
            )
            for r in _jsonl(HANDLABELLED)
        ]
    holdout = SHARED / "holdout" / "answer_check_labelled" / "qwen25math_math_cot_100_pairs.jsonl"
    if holdout.exists():
        rows = _jsonl(holdout)
        if quick:
            rows = rows[:160]
        sets["holdout: Qwen2.5-Math MATH CoT (measurement only)"] = [
            (r["response"], r["gold"], bool(r["is_correct"]), "response") for r in rows
        ]
    return sets


def ours(item: tuple[str, str, bool, str]) -> bool:
    text, gold, _, kind = item
    if kind == "pair":
        return is_equivalent(text, gold, timeout=TIMEOUT)
    return score(text, gold, timeout=TIMEOUT) == 1.0


def theirs(item: tuple[str, str, bool, str]) -> bool:
    text, gold, _, kind = item
    try:
        return mv_equivalent(text, gold) if kind == "pair" else mv_score(text, gold) == 1.0
    except Exception:
        return False


def _pool_map(fn: Callable[[Any], Any], items: list[Any], workers: int) -> list[Any]:
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return list(pool.imap(fn, items, chunksize=16))


def accuracy(quick: bool) -> list[str]:
    rows = ["| set | n | rlloom | Math-Verify |", "|---|---|---|---|"]
    for name, items in load_sets(quick).items():
        ours_ok = sum(ours(it) == it[2] for it in tqdm(items, desc=f"rlloom {name}", leave=False))
        theirs_ok = sum(r == it[2] for r, it in zip(_pool_map(theirs, items, 2), items, strict=True))
        rows.append(f"| {name} | {len(items)} | {ours_ok / len(items):.2%} | {theirs_ok / len(items):.2%} |")
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small samples, for a smoke run")
    parser.add_argument("--parts", default="accuracy,throughput,latency", help="comma list of parts to run")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if "accuracy" in parts:
        print("\n".join(accuracy(args.quick)))
