"""`vlm-geo3k` console script: data preparation now; train and eval follow (see ROADMAP)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlloom_apps.vlm_geo3k.data import prepare


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vlm-geo3k", description="VLM RL on Geometry3K.")
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare-data", help="convert Geometry3K problem folders to training rows")
    prep.add_argument("--input", required=True, type=Path, help="folder of problem folders (data.json + png)")
    prep.add_argument("--out", required=True, type=Path)
    prep.add_argument("--split", default="train")
    args = parser.parse_args(argv)
    if not args.input.is_dir():
        parser.error(f"--input {args.input} is not a folder")
    print(f"wrote {prepare(args.input, args.out, split=args.split)} rows to {args.out}")
