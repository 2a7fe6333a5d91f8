"""Benchmark rlloom.rewards.math against Math-Verify, measured in the same run.

Three parts:
1. accuracy on ../shared/data/answer_check_dev (hendrycks pairs, xVerify examples, GSM8K labelled model
   solutions) and on the package's hand-labelled set; a labelled holdout set is reported as measurement only;
   and Math-Verify's own test suite (the package's fixture), each case scored as its test scores it: Math-Verify
   with the case's options (extraction targets, `precision` as float rounding, `strict`, set relations), rlloom
   with its defaults and the case's `precision`, if any, as its `precision`;
2. throughput: responses/s over 5,000 MATH-style CoT responses built from MATH-500 solutions (right and wrong
   final answers), single process and with a 2-worker pool, as a ratio to Math-Verify in a loop;
3. worst-case latency: p99 and max of one `score` over adversarial inputs.

Run: .venv/bin/python bench/rewards.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rlloom.rewards.math import is_equivalent, score
from rlloom.rewards.math.equivalence import clear_symbolic_cache
from rlloom.rewards.math.numeric import MIN_SIGNIFICANT

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DEV = SHARED / "data" / "answer_check_dev"
HANDLABELLED = ROOT / "packages" / "rewards" / "tests" / "data" / "math_handlabelled.jsonl"
MV_SUITE = ROOT / "packages" / "rewards" / "tests" / "data" / "math_verify" / "cases.jsonl"
TIMEOUT = 3.0
# Accuracy is about verdicts, not speed: a generous SymPy budget keeps machine load from turning a symbolic case
# into a timeout (Math-Verify runs with no timeout at all in this script).
ACCURACY_TIMEOUT = 10.0


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


def mv_suite_case(case: dict[str, Any]) -> bool:
    """Math-Verify on one case of its own suite, as its tests call it (their `compare_strings` helper): the
    case's extraction targets (LaTeX with boxed_match_priority=0, expressions), then `verify` with the case's
    precision as float rounding (default 6), strict and allow_set_relation_comp."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    options = case["options"]
    targets: list[Any] = []
    for kind in options.get("match_types", ["latex", "expr"]):
        targets.append(LatexExtractionConfig(boxed_match_priority=0) if kind == "latex" else ExprExtractionConfig())
    try:
        gold, pred = parse(case["gold"], targets), parse(case["pred"], targets)
        return bool(
            verify(
                gold, pred, float_rounding=options.get("precision", 6), strict=options.get("strict", True),
                allow_set_relation_comp=options.get("allow_set_relation_comp", False),
            )
        )  # fmt: skip
    except Exception:
        return False


def ours_suite_case(case: dict[str, Any]) -> bool:
    """rlloom's `score` with its defaults, and the case's own `precision` where its test passes one."""
    precision = case["options"].get("precision", MIN_SIGNIFICANT)
    return score(case["pred"], case["gold"], timeout=ACCURACY_TIMEOUT, precision=precision) == 1.0


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
    mv_pairs = SHARED / "holdout" / "math_verify_pairs" / "math_verify_test_pairs.jsonl"
    if mv_pairs.exists() and not quick:
        sets["holdout: Math-Verify's own test pairs (its design decisions; measurement only)"] = [
            # Its preds and golds are texts its extractor reads ("$...$", "The answer is ..."), so both graders
            # get the pred as a response here.
            (r["pred"], r["gold"], bool(r["is_correct"]), "response")
            for r in _jsonl(mv_pairs)
        ]
    return sets


def ours(item: tuple[str, str, bool, str]) -> bool:
    text, gold, _, kind = item
    if kind == "pair":
        return is_equivalent(text, gold, timeout=ACCURACY_TIMEOUT)
    return score(text, gold, timeout=ACCURACY_TIMEOUT) == 1.0


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
    cases = _jsonl(MV_SUITE)
    ours_ok = sum(ours_suite_case(c) == c["expected"] for c in tqdm(cases, desc="rlloom suite", leave=False))
    theirs_ok = sum(r == c["expected"] for r, c in zip(_pool_map(mv_suite_case, cases, 2), cases, strict=True))
    n = len(cases)
    rows.append(f"| Math-Verify test suite (fixture, each case's options) | {n} | {ours_ok} | {theirs_ok} |")
    print(rows[-1], flush=True)
    return rows


# ---------------------------------------------------------------- throughput
def build_responses(n: int) -> list[tuple[str, str]]:
    """n MATH-style CoT responses from MATH-500 reference solutions; about 40% keep the right final answer."""
    rows = _jsonl(SHARED / "data" / "math500" / "test.jsonl")
    rng = random.Random(0)
    items: list[tuple[str, str]] = []
    for k in range(n):
        row = rows[k % len(rows)]
        solution, answer = row["solution"], row["answer"]
        variant = (k // len(rows)) % 5
        if variant in (1, 2, 4):  # a wrong final answer: another problem's answer, or an off-by-one number
            other = rows[rng.randrange(len(rows))]["answer"]
            wrong = str(int(answer) + 1) if variant == 2 and answer.lstrip("-").isdigit() else other
            cut = solution.rfind("\\boxed")
            solution = (solution[:cut] if cut >= 0 else solution) + f"\\boxed{{{wrong}}}$."
        elif variant == 3:
            solution = solution.replace("\\frac", "\\dfrac") + "\nThe final answer is above."
        items.append((solution, answer))
    return items


def _ours_item(item: tuple[str, str]) -> float:
    return score(item[0], item[1], timeout=TIMEOUT)


def _theirs_item(item: tuple[str, str]) -> float:
    try:
        return mv_score(item[0], item[1])
    except Exception:
        return 0.0


Batch = Callable[[list[tuple[str, str]]], list[float]]


def _rate(fn: Batch, items: list[tuple[str, str]]) -> tuple[float, list[float]]:
    start = time.perf_counter()
    out = fn(items)
    return len(items) / (time.perf_counter() - start), out


def _batch_runner() -> tuple[str, Batch, Callable[[], None]]:
    """rlloom.rewards.ScoringPool (2 workers, started and warmed once, as a trainer keeps it) when it exists,
    else a 2-process multiprocessing Pool; returns (label, run, close)."""
    try:
        from rlloom.rewards.batch import ScoringPool
    except ImportError:
        label = "multiprocessing.Pool(2) (score_batch not landed yet)"
        return label, lambda xs: _pool_map(_ours_item, xs, 2), lambda: None
    pool = ScoringPool(2, timeout=TIMEOUT + 2)

    def run(xs: list[tuple[str, str]]) -> list[float]:
        items = [
            {"response": r, "ground_truth": g, "data_source": "math", "extra_info": {"timeout": TIMEOUT}} for r, g in xs
        ]
        return [result.score for result in pool.score(items)]

    run([("\\boxed{1}", "1")] * 8)  # workers import SymPy once, before timing
    return "rlloom.rewards.score_batch (ScoringPool, 2 workers)", run, pool.close


def throughput(quick: bool, repeats: int) -> list[str]:
    items = build_responses(1000 if quick else 5000)
    label, batch, close_pool = _batch_runner()
    warm = items[:50]
    [_ours_item(x) for x in warm], [_theirs_item(x) for x in warm]
    results: dict[str, list[float]] = {"rlloom, 1 process": [], f"rlloom, {label}": [], "Math-Verify loop": []}
    outs: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, fn in (
            ("rlloom, 1 process", lambda xs: [_ours_item(x) for x in xs]),
            (f"rlloom, {label}", batch),
            ("Math-Verify loop", lambda xs: [_theirs_item(x) for x in xs]),
        ):
            clear_symbolic_cache()  # every timed run starts with an empty verdict cache (pool workers fork after this)
            rate, outs[name] = _rate(fn, items)
            results[name].append(rate)
            print(f"  {name}: {rate:.0f} responses/s", flush=True)
    close_pool()
    base = statistics.median(results["Math-Verify loop"])
    agree = sum(a == b for a, b in zip(outs["rlloom, 1 process"], outs["Math-Verify loop"], strict=True))
    rows = [
        f"{len(items)} responses, {sum(outs['rlloom, 1 process']):.0f} scored correct by rlloom, "
        f"{sum(outs['Math-Verify loop']):.0f} by Math-Verify; verdicts agree on {agree / len(items):.1%}",
        f"| scorer | responses/s (median of {repeats}) | ratio to Math-Verify loop |",
        "|---|---|---|",
    ]
    for name, rates in results.items():
        rows.append(f"| {name} | {statistics.median(rates):.0f} | {statistics.median(rates) / base:.2f}x |")
    return rows


# ---------------------------------------------------------------- worst-case latency
def adversarial_inputs() -> list[tuple[str, str]]:
    """Responses and golds built to hang or crash graders (see the issue and the notes on Math-Verify #14/#63/#65)."""
    responses = [
        "",
        "a" * 1_000_000,
        "1" * 1_000_000,
        "\\boxed{" * 50_000,
        "{" * 100_000,
        "\\boxed{9^{9^{9^9}}}",
        "\\boxed{10^{10^{10}}}",
        "\\boxed{2^{2^{2^{2^{2^{2}}}}}}",
        "\\boxed{99999999999^{99999999999}}",
        "\\boxed{100000!}",
        "\\boxed{(10^{100})!}",
        "\\boxed{1e999999999}",
        "\\boxed{" + "(" * 5000 + "1" + ")" * 5000 + "}",
        "\\boxed{" + "\\frac{1}{" * 400 + "2" + "}" * 400 + "}",
        "\\boxed{" + "\\sqrt{" * 400 + "2" + "}" * 400 + "}",
        "\\boxed{" + "x+" * 5000 + "1}",
        "\\boxed{\\begin{pmatrix}" + "1&" * 3000 + "1\\end{pmatrix}}",
        "\\boxed{\udcff\udcfe}",
        "\x00\x01\\boxed{\x00}",
        "The answer is " + "9" * 5000,
        "\\boxed{\\frac{1}{0}}",
        "\\boxed{\\left(}",
        "\\boxed{(x+1)^{200} - (x-1)^{200}}",
        "\\boxed{\\sin(x)^{40} + \\cos(x)^{40}}",
        "\\boxed{\\prod_{k=1}^{100} (x-k)}",
        "\\boxed{e^{e^{e^{e^{x}}}}}",
    ]
    golds = ["42", "x^{200}", "\\frac{1}{2}", "\\sin^{40}(x)+\\cos^{40}(x)+1"]
    return [(r, golds[i % len(golds)]) for i, r in enumerate(responses)]


def latency(quick: bool) -> list[str]:
    items = adversarial_inputs()
    score("\\boxed{\\sin^2 x + \\cos^2 x}", "1")  # one-time SymPy warm-up and worker fork, like an import
    times: list[float] = []
    slowest = ("", 0.0)
    for response, gold in tqdm(items, desc="adversarial", leave=False):
        start = time.perf_counter()
        score(response, gold, timeout=TIMEOUT)
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        if elapsed > slowest[1]:
            slowest = (response[:40], elapsed)
    times.sort()
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    return [
        f"{len(items)} adversarial responses, timeout {TIMEOUT:g} s: p50 {statistics.median(times):.3f} s, "
        f"p99 {p99:.3f} s, max {times[-1]:.3f} s (goal: max <= {TIMEOUT + 0.5:g} s); slowest: {slowest[0]!r}",
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small samples, for a smoke run")
    parser.add_argument("--parts", default="accuracy,throughput,latency", help="comma list of parts to run")
    parser.add_argument("--repeats", type=int, default=3, help="throughput repeats (median reported)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    print(f"machine: {os.cpu_count()} CPUs (shared with other jobs); python {sys.version.split()[0]}")
    report: list[str] = []
    if "accuracy" in parts:
        report += ["", "### accuracy", *accuracy(args.quick)]
    if "throughput" in parts:
        report += ["", "### throughput", *throughput(args.quick, 1 if args.quick else args.repeats)]
    if "latency" in parts:
        report += ["", "### worst-case latency", *latency(args.quick)]
    print("\n".join(report))
