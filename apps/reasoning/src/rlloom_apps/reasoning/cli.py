"""`reasoning` console script: data preparation now; train and eval entry points follow (see ROADMAP)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlloom_apps.reasoning.data import FIELDS, prepare


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="reasoning", description="Math RL with verifiable rewards.")
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare-data", help="convert a math dataset (JSONL) to training rows")
    prep.add_argument("--dataset", required=True, choices=sorted(FIELDS))
    prep.add_argument("--input", required=True, type=Path, help="source JSONL, e.g. gsm8k/test.jsonl")
    prep.add_argument("--out", required=True, type=Path, help="output JSONL of training rows")
    prep.add_argument("--split", default="test")
    prep.add_argument("--limit", type=int, default=None, help="keep only the first N rows")
    args = parser.parse_args(argv)
    if not args.input.is_file():
        parser.error(f"--input {args.input} does not exist")
    n = prepare(args.dataset, args.input, args.out, split=args.split, limit=args.limit)
    print(f"wrote {n} rows to {args.out}")
