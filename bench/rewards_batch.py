"""Benchmark rlloom.rewards' batch scoring pool against concurrent.futures.ProcessPoolExecutor, same run.

The pool's job is safety (per-item kill on timeout, crash and memory isolation); this measures what that costs
in throughput against the standard pool that has none of it, on two workloads:
- "qa": SQuAD EM on Search-R1-style responses (about 20 us of work: measures pure per-item overhead);
- "math": rlloom.rewards.math on MATH-500-derived CoT responses (the real RL workload), if the math scorer exists.
Both pools are started and warmed once (as a trainer keeps them); medians over repeats.

Run: .venv/bin/python bench/rewards_batch.py [--n 5000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rlloom.rewards.batch import ScoreItem, ScoringPool, score_item

ROOT = Path(__file__).resolve().parents[1]
MATH500 = ROOT.parent / "shared" / "data" / "math500" / "test.jsonl"


def qa_items(n: int) -> list[dict[str, Any]]:
    answers = ["Paris", "the Beatles", "1990", "Mount Everest", "Marie Curie"]
    return [
        {"response": f"<think>step {k}</think><answer>{answers[k % 5] if k % 3 else 'London'}</answer>",
         "ground_truth": {"target": [answers[k % 5]]}, "data_source": "nq"}
        for k in range(n)
    ]  # fmt: skip


def math_items(n: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in MATH500.read_text().splitlines() if line.strip()]
    out = []
    for k in range(n):
        row = rows[k % len(rows)]
        solution = row["solution"] if k % 2 else row["solution"].replace(row["answer"], row["answer"] + "1")
        out.append({"response": solution, "ground_truth": row["answer"], "data_source": "math"})
    return out


def _score_dict(item: dict[str, Any]) -> float:
    return score_item(ScoreItem.model_validate(item)).score


def timed(fn: Any, items: list[dict[str, Any]], repeats: int) -> tuple[float, list[float]]:
    rates, out = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(items)
        rates.append(len(items) / (time.perf_counter() - start))
    return statistics.median(rates), out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    workloads = {"qa": qa_items(args.n)}
    if MATH500.is_file():
        workloads["math"] = math_items(args.n)
    print(
        f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f} n={args.n} workers={args.workers} repeats={args.repeats}"
    )
    print("| workload | in-process loop | ScoringPool | ProcessPoolExecutor | pool / executor | same scores |")
    print("|---|---|---|---|---|---|")
    with ScoringPool(args.workers, timeout=30) as pool, ProcessPoolExecutor(args.workers) as executor:
        for name, items in workloads.items():
            warm = items[: 4 * args.workers]
            pool.score(warm)
            list(executor.map(_score_dict, warm))
            inline, expected = timed(lambda xs: [_score_dict(x) for x in xs], items, 1)
            ours, got = timed(lambda xs: [r.score for r in pool.score(xs)], items, args.repeats)
            peer, peer_got = timed(lambda xs: list(executor.map(_score_dict, xs, chunksize=64)), items, args.repeats)
            agree = sum(a == b == c for a, b, c in zip(got, expected, peer_got, strict=True)) / len(items)
            print(
                f"| {name} | {inline:,.0f}/s | {ours:,.0f}/s | {peer:,.0f}/s | {ours / peer:.2f}x | {agree:.2%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
