"""`search-agent` console script: `prepare-data` (QA sets to Search-R1 rows) and `train` (GRPO/PPO with search)."""

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
    fit = commands.add_parser(
        "train",
        help="train a search agent (Search-R1's GRPO or PPO setup) on prepared rows",
        description="Multi-turn rollouts with search through rlloom's AgentLoop, rewarded by exact match of the "
        "last <answer>. Extra arguments are dotted config overrides, e.g. model.path=/models/Qwen2.5-3B "
        "search.max_turns=2 actor.lr=5e-7.",
    )
    fit.add_argument("--config", default="grpo", help="grpo, ppo (Search-R1's setups) or a YAML file")
    fit.add_argument("--train-data", required=True, type=Path, help="JSONL rows from prepare-data")
    fit.add_argument("--val-data", type=Path, default=None, help="JSONL rows for validation (greedy EM)")
    where = fit.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", type=Path, help="an index folder built by rlloom-retrieval, loaded in-process")
    where.add_argument("--retrieval-url", help="a running retrieval server, e.g. http://127.0.0.1:8000")
    fit.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    args = parser.parse_args(argv)
    if args.command == "train":
        _train(parser, args)
        return
    if not args.input.is_file():
        parser.error(f"--input {args.input} does not exist")
    n = prepare(args.data_source, args.input, args.out, split=args.split, limit=args.limit)
    print(f"wrote {n} rows to {args.out}")


def _train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from pydantic import ValidationError
    from rlloom_apps.search_agent.train import CONFIGS, run_train

    from rlloom.core_rl.config import ConfigError

    config = CONFIGS / f"{args.config}.yaml" if args.config in ("grpo", "ppo") else Path(args.config)
    for label, path in (("--config", config), ("--train-data", args.train_data), ("--val-data", args.val_data)):
        if path is not None and not path.is_file():
            parser.error(f"{label} {path} does not exist")
    if args.index is not None and not args.index.is_dir():
        parser.error(f"--index {args.index} is not a folder (build one with rlloom-retrieval)")
    try:
        metrics = run_train(
            config,
            train_data=args.train_data,
            val_data=args.val_data,
            index=args.index,
            retrieval_url=args.retrieval_url,
            overrides=args.overrides,
        )
    except (ConfigError, ValidationError) as err:
        parser.error(str(err))
    shown = {k: round(v, 4) for k, v in metrics.items() if k.startswith(("reward/", "val/", "rollout/turns"))}
    print(f"last step: {shown}")
