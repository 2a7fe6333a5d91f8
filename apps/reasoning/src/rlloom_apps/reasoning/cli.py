"""`reasoning` console script: `demo` (train a tiny model end to end on CPU) and `prepare-data`."""

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
    demo = commands.add_parser(
        "demo",
        help="train a tiny model end to end on CPU (warm-up, then GRPO with held-out validation)",
        description="Supervised warm-up, then GRPO on digit reversal with rlloom's trainer, HF engine and a "
        "rewards Rubric (exact answer + digits in place). Extra arguments are dotted trainer-config "
        "overrides, e.g. actor.lr=5e-4 rollout.n=4.",
    )
    demo.add_argument("--steps", type=int, default=None, help="GRPO steps (default: demo.yaml's 150)")
    demo.add_argument("--seed", type=int, default=0, help="model initialisation, warm-up and training seed")
    demo.add_argument("--out", type=Path, default=None, help="run folder (default: runs/demo-<timestamp>)")
    demo.add_argument("overrides", nargs="*", metavar="key=value", help="trainer config overrides")
    args = parser.parse_args(argv)
    if args.command == "demo":
        _demo(parser, args)
        return
    if not args.input.is_file():
        parser.error(f"--input {args.input} does not exist")
    n = prepare(args.dataset, args.input, args.out, split=args.split, limit=args.limit)
    print(f"wrote {n} rows to {args.out}")


def _demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from pydantic import ValidationError
    from rlloom_apps.reasoning.demo import run_demo
    from rlloom_apps.reasoning.demo_report import before_after_table

    from rlloom.core_rl.config import ConfigError
    from rlloom.core_rl.curves import plot_or_draw

    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    try:
        result = run_demo(output_dir=args.out, steps=args.steps, seed=args.seed, overrides=args.overrides)
    except (ConfigError, ValidationError, FileExistsError) as err:
        parser.error(str(err))
    print(f"\nrun folder: {result.output_dir} ({result.seconds:.0f} s)")
    print(before_after_table(result))
    print(f"(also in {result.output_dir / 'before_after.md'})")
    title = "rlloom demo: GRPO on digit reversal"
    print(plot_or_draw(result.val_curve, result.train_curve, result.output_dir / "reward_curve.png", title=title))
