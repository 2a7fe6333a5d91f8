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
hybrid) or import Search-R1's prebuilt ones, serve it (or Google / SerpAPI search, optionally reranked by a
cross-encoder) over HTTP with Search-R1's /retrieve API, search it from the shell, and measure it
(nDCG/Recall/MRR against qrels, or answer-hit@k against a QA file)."""

EXAMPLES = """\
examples:
  rlloom-retrieval build-index --corpus corpus.jsonl --out indexes/wiki-bm25 --preset bm25-pyserini
  rlloom-retrieval build-index --corpus corpus.jsonl --out indexes/wiki-e5 --preset e5 --opt model=/models/e5-base-v2
  rlloom-retrieval search "who wrote the iliad" --index indexes/wiki-bm25 -k 5
  rlloom-retrieval import-faiss --faiss e5_Flat.index --corpus wiki-18.jsonl --out indexes/wiki-e5 \\
      --opt model=/models/e5-base-v2
  rlloom-retrieval import-lucene --lucene wiki18/bm25 --corpus wiki-18.jsonl --out indexes/wiki-lucene
  rlloom-retrieval serve --index indexes/wiki-bm25 --port 8000
  rlloom-retrieval serve --index indexes/wiki-e5 --rerank-model /models/ms-marco-MiniLM-L12-v2
  GOOGLE_API_KEY=... GOOGLE_CSE_ID=... rlloom-retrieval serve --online google --opt cache_dir=cache
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
        allow_abbrev=False,  # flags spelled out: `--k` must not quietly mean `--k1` (nor later flags' prefixes)
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    build = sub.add_parser(
        "build-index",
        allow_abbrev=False,
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
        allow_abbrev=False,
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
        help="dense option, repeatable: model=DIR (required: the encoder's local folder), index_type (flat, sq8, "
        "ivfpq, hnsw), flat_fp16, ... (default: none)",
    )
    imp.add_argument(
        "--recall-probes",
        type=int,
        default=200,
        help="with a compressed index_type: stored vectors searched in it and exactly, for the recall@1/3/10 "
        "report; 0 skips it (default: %(default)s)",
    )

    luc = sub.add_parser(
        "import-lucene",
        allow_abbrev=False,
        help="make a lucene index folder from a prebuilt pyserini Lucene index and its corpus (Search-R1's "
        "wiki-18 BM25)",
        description="Adopt a Lucene index that pyserini/Anserini built from --corpus (Search-R1's "
        "wiki-18-bm25-index: JsonCollection, doc ids = passage ids) as a lucene index folder, without re-indexing. "
        "Its files are hard-linked (copied across filesystems). Needs the `lucene` extra.",
    )
    luc.add_argument("--lucene", required=True, type=Path, help="the Lucene index folder (holds segments_N)")
    luc.add_argument("--corpus", required=True, type=Path, help="its corpus: Search-R1 or BEIR JSONL, or .gz")
    luc.add_argument("--out", required=True, type=Path, help="index folder to create (as build-index --out)")
    luc.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="lucene option, repeatable: k1 (0.9), b (0.4), threads (2) (default: none)",
    )

    serve = sub.add_parser(
        "serve",
        allow_abbrev=False,
        help="serve an index or an online engine over HTTP (Search-R1 /retrieve, /search, /health, /stats)",
        description="Serve an index folder, or Google Custom Search / SerpAPI, over HTTP until interrupted: "
        "Search-R1's POST /retrieve, the native POST /search, GET /health and GET /stats. With --rerank-model, "
        "each query's candidates are reranked by a cross-encoder (Search-R1's retrieval_rerank_server API) and "
        "POST /rerank reranks documents sent with the queries (its rerank_server API); --rerank-model alone serves "
        "only /rerank.",
    )
    source = serve.add_mutually_exclusive_group()
    source.add_argument("--index", type=Path, help="index folder made by build-index or an import")
    source.add_argument(
        "--online",
        choices=["google", "serpapi"],
        help="search online instead: google (keys in GOOGLE_API_KEY, GOOGLE_CSE_ID) or serpapi (SERPAPI_API_KEY)",
    )
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
        help="ServerLimits field, repeatable: max_queries (8192), max_topk (100), max_query_chars (4096, longer "
        "queries are cut and reported), default_topk (3), max_body_bytes (64 MiB), max_response_bytes (256 MiB), "
        "batch_window_ms (1.0), max_batch_queries (1024), max_pending_queries (8192), body_timeout_s (30), "
        "idle_timeout_s (5), max_connections (half the open-file limit), freeze_gc (true) (default: none)",
    )
    serve.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"with --index: {QUERY_OPT_HELP}; with --online: the engine's settings (cache_dir, cache_ttl_s, "
        "max_qps, max_concurrency, retries, timeout_s, base_url; google: full_page (Search-R1's full-page mode), "
        "page_timeout_s (5), page_concurrency (8), max_page_bytes (2 MiB); serpapi: engine)",
    )
    serve.add_argument(
        "--rerank-model",
        type=Path,
        default=None,
        help="local sentence-transformers CrossEncoder folder: rerank each query's candidates with it, and answer "
        "POST /rerank; without --index/--online, /rerank only (extra `dense`) (default: no reranking)",
    )
    serve.add_argument(
        "--rerank-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="reranker setting, repeatable: depth (10 candidates a query), batch_size (32), max_length (512), "
        "device, passage_format (search-r1 | contents) (default: none)",
    )

    search = sub.add_parser(
        "search",
        allow_abbrev=False,
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
        allow_abbrev=False,
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
            from rlloom.retrieval.prebuilt import import_faiss_index, import_report

            check_output_folder_flag(args.out)
            if args.recall_probes < 0:
                raise ValueError(f"--recall-probes must be >= 0, got {args.recall_probes}")
            out = import_faiss_index(
                args.corpus,
                args.faiss,
                args.out,
                preset=args.preset,
                recall_probes=args.recall_probes,
                **_options(args.opt),
            )
            print(f"imported {args.faiss} as a dense index at {out} (preset {args.preset})")
            report = import_report(out)
            if report is not None:
                recalls = ", ".join(f"{key} {value:.4f}" for key, value in report.items() if key.startswith("recall"))
                print(f"{report['index_type']} against exact search ({report['probes']} probes): {recalls}")
        elif args.command == "import-lucene":
            from rlloom.retrieval.prebuilt import import_lucene_index

            check_output_folder_flag(args.out)
            out = import_lucene_index(args.corpus, args.lucene, args.out, **_options(args.opt))
            print(f"imported {args.lucene} as a lucene index at {out}")
        elif args.command == "serve":
            from rlloom.retrieval.server import ServerLimits
            from rlloom.retrieval.serving import serve

            rerank = None
            if args.rerank_model is not None:
                rerank = {**_options(args.rerank_opt, "--rerank-opt"), "model": str(args.rerank_model)}
            elif args.rerank_opt:
                raise ValueError("--rerank-opt needs --rerank-model (the cross-encoder's folder)")
            serve(
                args.index,
                online=args.online,
                rerank=rerank,
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
