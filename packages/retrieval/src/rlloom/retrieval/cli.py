"""`rlloom-retrieval build-index | serve | search | eval`: thin argparse wiring over the package's functions."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlloom.retrieval.types import CorpusFormatError, IndexLoadError


def _options(pairs: list[str]) -> dict[str, Any]:
    """`--opt key=value` pairs; values parse as JSON when they can (numbers, booleans, lists), else stay strings."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--opt expects key=value, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _add_build_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="bm25", choices=["bm25", "dense", "lucene", "hybrid"])
    parser.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="backend option, repeatable (e.g. k1=0.9, stemmer=english, model=/path, index_type=hnsw; "
        'hybrid: first={"backend":"bm25"} second={"backend":"dense","model":"/path"})',
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlloom-retrieval", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build-index", help="build an index folder from a Search-R1 or BEIR JSONL(.gz) corpus")
    build.add_argument("--corpus", required=True, type=Path)
    build.add_argument("--out", required=True, type=Path)
    _add_build_args(build)

    serve = sub.add_parser("serve", help="serve an index over HTTP (Search-R1 /retrieve, /search, /health, /stats)")
    serve.add_argument("--index", required=True, type=Path)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1)
    serve.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE", help="ServerLimits field")
    serve.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="query-time index override")

    search = sub.add_parser("search", help="search one query and pretty-print the hits")
    search.add_argument("query")
    search.add_argument("--index", required=True, type=Path)
    search.add_argument("-k", type=int, default=5)

    ev = sub.add_parser("eval", help="nDCG@10, Recall@{1,5,10,100}, MRR@10 (--qrels) or answer-hit@k (--answers)")
    where = ev.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", type=Path, help="an existing index folder")
    where.add_argument("--corpus", type=Path, help="build a temporary index from this corpus first")
    ev.add_argument("--queries", required=True, type=Path)
    mode = ev.add_mutually_exclusive_group(required=True)
    mode.add_argument("--qrels", type=Path)
    mode.add_argument("--answers", action="store_true", help="answer-hit@k from the queries' answers")
    _add_build_args(ev)
    return parser


def _print_hits(query: str, hits: list[Any]) -> None:
    print(f"query: {query}")
    for rank, hit in enumerate(hits, start=1):
        title = f" | {hit.title}" if hit.title else ""
        text = hit.text if len(hit.text) <= 240 else hit.text[:240] + "…"
        print(f"{rank:>3}. [{hit.doc_id}{title}] score={hit.score:.4f}\n     {text}")


def _eval(args: argparse.Namespace) -> None:
    from rlloom.retrieval.evaluation import evaluate_answers, evaluate_qrels, read_qrels, read_queries
    from rlloom.retrieval.index import build_index, load_index

    queries = read_queries(args.queries)
    with tempfile.TemporaryDirectory(prefix="rlloom-eval-") as tmp:
        path = args.index or build_index(args.corpus, Path(tmp) / "index", args.backend, **_options(args.opt))
        retriever = load_index(path)
        scores = (
            evaluate_answers(retriever, queries)
            if args.answers
            else evaluate_qrels(retriever, queries, read_qrels(args.qrels))
        )
    width = max(len(name) for name in scores)
    print(f"{retriever.manifest.backend} on {args.queries} ({len(queries)} queries)")
    for name, value in scores.items():
        print(f"{name:<{width}}  {value:.4f}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "build-index":
            from rlloom.retrieval.index import build_index

            out = build_index(args.corpus, args.out, args.backend, **_options(args.opt))
            print(f"built {args.backend} index at {out}")
        elif args.command == "serve":
            from rlloom.retrieval.server import ServerLimits, serve

            limits = ServerLimits(**_options(args.limit))
            print(f"serving {args.index} on http://{args.host}:{args.port} ({args.workers} worker(s))", flush=True)
            serve(
                args.index,
                host=args.host,
                port=args.port,
                workers=args.workers,
                limits=limits,
                **_options(args.opt),
            )
        elif args.command == "search":
            from rlloom.retrieval.index import load_index

            _print_hits(args.query, load_index(args.index).search([args.query], args.k)[0])
        else:
            _eval(args)
    except (IndexLoadError, CorpusFormatError, ValueError, ValidationError, FileNotFoundError, ImportError) as err:
        print(f"rlloom-retrieval {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
