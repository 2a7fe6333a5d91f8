"""`rlloom-retrieval build-index | serve | search | eval`: the package's functions as one console script."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlloom.retrieval.presets import PRESETS
from rlloom.retrieval.types import CorpusFormatError, IndexLoadError

DESCRIPTION = """\
Retrieval for search agents: build an index folder from a Search-R1 or BEIR JSONL corpus (BM25, dense, Lucene or
hybrid), serve it over HTTP with Search-R1's /retrieve API, search it from the shell, and measure it
(nDCG/Recall/MRR against qrels, or answer-hit@k against a QA file)."""

EXAMPLES = """\
examples:
  rlloom-retrieval build-index --corpus corpus.jsonl --out indexes/wiki-bm25 --preset bm25-pyserini
  rlloom-retrieval build-index --corpus corpus.jsonl --out indexes/wiki-e5 --preset e5 --opt model=/models/e5-base-v2
  rlloom-retrieval search "who wrote the iliad" --index indexes/wiki-bm25 -k 5
  rlloom-retrieval import-faiss --faiss e5_Flat.index --corpus wiki-18.jsonl --out indexes/wiki-e5 \\
      --opt model=/models/e5-base-v2
  rlloom-retrieval serve --index indexes/wiki-bm25 --port 8000
  rlloom-retrieval search "who wrote the iliad" --url http://127.0.0.1:8000
  rlloom-retrieval eval --index indexes/wiki-bm25 --queries nq.jsonl --answers

Errors print one line naming the flag or file and exit 2. See `rlloom-retrieval COMMAND --help`."""


def _options(pairs: list[str], flag: str = "--opt") -> dict[str, Any]:
    """`--opt key=value` pairs; values parse as JSON when they can (numbers, booleans, lists), else stay strings."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE (e.g. {flag} k1=0.9), got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


BUILD_OPT_HELP = (
    "backend option, repeatable; the value parses as JSON when it can (e.g. k1=0.9, stemmer=english, "
    'model=/path/to/model-folder, index_type=hnsw; hybrid: first={"backend":"bm25"} '
    'second={"backend":"dense","model":"/path"}); the fields are listed in the README (default: none)'
)
QUERY_OPT_HELP = (
    "query-time index option, repeatable (bm25: n_threads; dense: hnsw_ef_search, ivf_nprobe, device, "
    "query_prefix, ...; hybrid: fusion, weights, depth, ...); build-time options are refused (default: none)"
)


def _add_backend_arg(parser: argparse.ArgumentParser, help_prefix: str, default: str | None) -> None:
    parser.add_argument(
        "--backend",
        default=default,
        choices=["bm25", "dense", "lucene", "hybrid"],
        help=f"{help_prefix}: bm25 (no extras), dense (extra `dense`), lucene (extra `lucene`) or hybrid "
        "(default: bm25)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlloom-retrieval",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    build = sub.add_parser(
        "build-index",
        help="build an index folder from a Search-R1 or BEIR JSONL(.gz) corpus",
        description="Build an index folder from a corpus. The new index is written beside --out and renamed into "
        "place when complete; --out may be a new path, an empty folder or an existing index (replaced).",
    )
    build.add_argument("--corpus", required=True, type=Path, help="corpus file: Search-R1 or BEIR JSONL, or .gz")
    build.add_argument(
        "--out", required=True, type=Path, help="index folder to create: a new path, an empty folder or an old index"
    )
    _add_backend_arg(build, "index kind", None)
    build.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=None,
        help="named settings that pick the backend and fill in options (--opt wins): "
        + "; ".join(f"{name}: {preset.about}" for name, preset in PRESETS.items())
        + " (default: none)",
    )
    build.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help=BUILD_OPT_HELP)

    imp = sub.add_parser(
        "import-faiss",
        help="make a dense index folder from a prebuilt faiss index and its corpus (Search-R1's wiki-18 e5)",
        description="Adopt a prebuilt faiss index whose vector i embeds line i of --corpus (Search-R1's "
        "e5_Flat.index with wiki-18.jsonl) as a dense index folder, without re-encoding the corpus. Loading it "
        "checks that --opt model re-embeds the first passage to the stored vector.",
    )
    imp.add_argument("--faiss", required=True, type=Path, help="the faiss index file, e.g. e5_Flat.index")
    imp.add_argument("--corpus", required=True, type=Path, help="its corpus: Search-R1 or BEIR JSONL, or .gz")
    imp.add_argument("--out", required=True, type=Path, help="index folder to create (as build-index --out)")
    imp.add_argument(
        "--preset",
        choices=[name for name, preset in PRESETS.items() if preset.backend == "dense"],
        default="e5",
        help="the encoder settings the vectors were made with; e5 is Search-R1's (default: %(default)s)",
    )
    imp.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dense option, repeatable: model=DIR (required: the encoder's local folder), index_type, flat_fp16, "
        "... (default: none)",
    )

    serve = sub.add_parser(
        "serve",
        help="serve an index over HTTP (Search-R1 /retrieve, /search, /health, /stats)",
        description="Serve an index over HTTP until interrupted: Search-R1's POST /retrieve, the native "
        "POST /search, GET /health and GET /stats.",
    )
    serve.add_argument("--index", required=True, type=Path, help="index folder made by build-index")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 for all (default: %(default)s)"
    )
    serve.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default: %(default)s)")
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="uvicorn worker processes, each loading the index (default: %(default)s)",
    )
    serve.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="ServerLimits field, repeatable: max_queries (512), max_topk (100), max_query_chars (4096), "
        "default_topk (3), max_body_bytes (room for max_queries x max_query_chars), batch_window_ms (1.0), "
        "max_batch_queries (1024), max_pending_queries (8192), body_timeout_s (30), idle_timeout_s (5), "
        "max_connections (half the open-file limit), freeze_gc (true) (default: none)",
    )
    serve.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help=QUERY_OPT_HELP)

    search = sub.add_parser(
        "search",
        help="search one query in an index folder or a running server and print the hits",
        description="Search one query and print the hits, best first: in a local index (--index) or through a "
        "running server (--url).",
    )
    search.add_argument("query", help="the query text (quote it)")
    where = search.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", type=Path, help="index folder made by build-index")
    where.add_argument("--url", help="base URL of a running server, e.g. http://127.0.0.1:8000")
    search.add_argument(
        "--api",
        default="native",
        choices=["native", "search-r1"],
        help="with --url: the server's API, rlloom's /search or Search-R1's /retrieve (default: %(default)s)",
    )
    search.add_argument("-k", type=int, default=5, help="number of hits to print (default: %(default)s)")

    ev = sub.add_parser(
        "eval",
        help="nDCG@10, Recall@{1,5,10,100}, MRR@10 (--qrels) or answer-hit@k (--answers)",
        description="Measure retrieval: against qrels (nDCG@10, Recall@1/5/10/100, MRR@10) or against the gold "
        "answers in a QA file (answer-hit@1/3/5/10/20).",
    )
    index_or_corpus = ev.add_mutually_exclusive_group(required=True)
    index_or_corpus.add_argument("--index", type=Path, help="an existing index folder")
    index_or_corpus.add_argument("--corpus", type=Path, help="build a temporary index from this corpus file first")
    ev.add_argument(
        "--queries",
        required=True,
        type=Path,
        help="queries file: BEIR queries.jsonl, QA JSONL (question + answer/answers/golden_answers), "
        "`search-agent prepare-data` rows, or a JSON list of such objects",
    )
    mode = ev.add_mutually_exclusive_group(required=True)
    mode.add_argument("--qrels", type=Path, help="relevance judgements: BEIR qrels TSV or TREC qrels")
    mode.add_argument("--answers", action="store_true", help="answer-hit@k from the gold answers in --queries")
    _add_backend_arg(ev, "with --corpus: the temporary index's kind", None)
    ev.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --corpus: backend build option as in build-index; with --index: " + QUERY_OPT_HELP,
    )
    return parser


def _print_hits(query: str, hits: list[Any]) -> None:
    print(f"query: {query}")
    for rank, hit in enumerate(hits, start=1):
        title = f" | {hit.title}" if hit.title else ""
        text = hit.text if len(hit.text) <= 240 else hit.text[:240] + "…"
        print(f"{rank:>3}. [{hit.doc_id}{title}] score={hit.score:.4f}\n     {text}")


def _search(args: argparse.Namespace) -> None:
    if args.k < 1:
        raise ValueError(f"-k must be at least 1, got {args.k}")
    if args.url is None:
        from rlloom.retrieval.index import load_index

        _print_hits(args.query, load_index(args.index).search([args.query], args.k)[0])
        return
    from rlloom.retrieval.client import RetrievalClient

    with RetrievalClient(args.url, api=args.api, retries=1) as client:
        _print_hits(args.query, client.search([args.query], args.k)[0])


def _eval(args: argparse.Namespace) -> None:
    from rlloom.retrieval.evaluation import (
        check_qrels_documents,
        evaluate_answers,
        evaluate_qrels,
        read_qrels,
        read_queries,
    )
    from rlloom.retrieval.index import build_index, load_index

    queries = read_queries(args.queries)
    qrels = read_qrels(args.qrels) if args.qrels else None
    options = _options(args.opt)
    with tempfile.TemporaryDirectory(prefix="rlloom-eval-") as tmp:
        if args.index is not None:  # --opt then only changes query-time fields; build-time ones are refused
            if args.backend is not None:
                raise ValueError(
                    f"--backend only applies with --corpus (to build a temporary index); {args.index} is already "
                    "built, so leave --backend out"
                )
            retriever = load_index(args.index, **options)
        else:
            path = build_index(args.corpus, Path(tmp) / "index", args.backend or "bm25", **options)
            retriever = load_index(path)
        if qrels is None:
            scores = evaluate_answers(retriever, queries)
        else:
            missing = check_qrels_documents(qrels, retriever.has_document)
            if missing:
                judged = len({doc for docs in qrels.values() for doc in docs})
                print(
                    f"rlloom-retrieval eval: WARNING: {len(missing)} of {judged} documents in {args.qrels} are not "
                    f"in the index (e.g. {', '.join(missing[:3])}); the metrics count them as never retrieved",
                    file=sys.stderr,
                )
            scores = evaluate_qrels(retriever, queries, qrels)
    width = max(len(name) for name in scores)
    print(f"{retriever.manifest.backend} on {args.queries} ({len(queries)} queries)")
    for name, value in scores.items():
        print(f"{name:<{width}}  {value:.4f}")


def check_output_folder_flag(out: Path) -> None:
    from rlloom.retrieval.manifest import check_output_folder

    check_output_folder(out, "--out")


def main(argv: list[str] | None = None) -> int:
    from rlloom.retrieval.client import RetrievalError

    args = _parser().parse_args(argv)
    try:
        if args.command == "build-index":
            from rlloom.retrieval.index import build_index
            from rlloom.retrieval.manifest import check_output_folder

            check_output_folder(args.out, "--out")
            out = build_index(args.corpus, args.out, args.backend, preset=args.preset, **_options(args.opt))
            backend = PRESETS[args.preset].backend if args.preset else args.backend or "bm25"
            print(f"built {backend} index at {out}" + (f" (preset {args.preset})" if args.preset else ""))
        elif args.command == "import-faiss":
            from rlloom.retrieval.prebuilt import import_faiss_index

            check_output_folder_flag(args.out)
            out = import_faiss_index(args.corpus, args.faiss, args.out, preset=args.preset, **_options(args.opt))
            print(f"imported {args.faiss} as a dense index at {out} (preset {args.preset})")
        elif args.command == "serve":
            from rlloom.retrieval.server import ServerLimits, serve

            serve(
                args.index,
                host=args.host,
                port=args.port,
                workers=args.workers,
                limits=ServerLimits(**_options(args.limit, "--limit")),
                **_options(args.opt),
            )
        elif args.command == "search":
            _search(args)
        else:
            _eval(args)
    except (IndexLoadError, CorpusFormatError, ValueError, ValidationError, OSError, ImportError) as err:
        print(f"rlloom-retrieval {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except RetrievalError as err:
        print(f"rlloom-retrieval {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


def _one_line(err: Exception) -> str:
    if isinstance(err, ValidationError):  # only ServerLimits reaches here: backend options become ValueErrors
        return "; ".join(
            f"--limit {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors(include_url=False)
        )
    return str(err)


if __name__ == "__main__":
    raise SystemExit(main())
