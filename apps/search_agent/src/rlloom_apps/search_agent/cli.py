"""`search-agent` console script: data preparation now; train, eval, infer and demo follow (see ROADMAP)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlloom_apps.search_agent.data import prepare

DATA_SOURCES = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="search-agent", description="Search-R1 style search agents.")
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare-data", help="convert a QA set (JSONL or JSON list) to Search-R1 rows")
    prep.add_argument("--data-source", required=True, choices=DATA_SOURCES)
    prep.add_argument("--input", required=True, type=Path)
    prep.add_argument("--out", required=True, type=Path)
    prep.add_argument("--split", default="test")
    prep.add_argument("--limit", type=int, default=None)
    args = parser.parse_args(argv)
    if not args.input.is_file():
        parser.error(f"--input {args.input} does not exist")
    n = prepare(args.data_source, args.input, args.out, split=args.split, limit=args.limit)
    print(f"wrote {n} rows to {args.out}")
