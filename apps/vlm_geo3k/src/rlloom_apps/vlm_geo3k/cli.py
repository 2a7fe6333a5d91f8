"""`vlm-geo3k` console script: `prepare-data` (Geometry3K folders -> rows), `train` (GRPO on a Qwen2.5-VL) and
`demo` (a tiny VLM learns a colour-naming task on synthetic pictures, on CPU)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rlloom_apps.vlm_geo3k.data import prepare

from rlloom.core_rl.demo_cli import add_demo_command


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vlm-geo3k", description="VLM RL on Geometry3K.")
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare-data", help="convert Geometry3K problem folders to training rows")
    prep.add_argument("--input", required=True, type=Path, help="folder of problem folders (data.json + png)")
    prep.add_argument("--out", required=True, type=Path)
    prep.add_argument("--split", default="train")
    fit = commands.add_parser(
        "train",
        help="GRPO on prepared rows with the bundled EasyR1 config (or your YAML)",
        description="Train a Qwen2.5-VL with core-rl's Trainer: image prompts sampled from an HF engine on the "
        "actor, scored by EasyR1's math reward (0.9 accuracy + 0.1 format). Extra arguments are dotted config "
        "overrides, e.g. model.path=/models/Qwen2.5-VL-7B-Instruct vision.max_pixels=1003520 rollout.n=8.",
    )
    fit.add_argument("--config", default="grpo", help="grpo, or a YAML file")
    fit.add_argument("--train-data", required=True, type=Path, help="JSONL rows from prepare-data")
    fit.add_argument("--val-data", type=Path, default=None, help="JSONL rows for validation")
    fit.add_argument("--score-workers", type=int, default=None, help="scoring processes (default: one per core)")
    fit.add_argument("--score-timeout", type=float, default=30.0, help="seconds per sample's scoring at most")
    fit.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    add_demo_command(
        commands,
        help="a tiny VLM learns to name a square's colour from reward, on CPU (about 2.5 minutes)",
        description="Synthetic pictures, a supervised warm-up that stops early, then GRPO through the same wiring "
        "as train. Extra arguments are dotted config overrides, e.g. actor.lr=3e-4 rollout.n=16.",
        default_steps=40,
        seed_help="pictures, model, warm-up and training seed",
        run_prefix="vlm-demo",
    )
    args = parser.parse_args(argv)
    if args.command == "train":
        _train(parser, args)
        return
    if args.command == "demo":
        _demo(parser, args)
        return
    if not args.input.is_dir():
        parser.error(f"--input {args.input} is not a folder")
    print(f"wrote {prepare(args.input, args.out, split=args.split)} rows to {args.out}")


def _train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from pydantic import ValidationError
    from rlloom_apps.vlm_geo3k.train import load_config, run_train

    from rlloom.core_rl.config import ConfigError

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for label, path in (("--train-data", args.train_data), ("--val-data", args.val_data)):
        if path is not None and not path.is_file():
            parser.error(f"{label} {path} does not exist (make rows with `vlm-geo3k prepare-data`)")
    try:
        config, vision = load_config(args.config, args.overrides)
        metrics = run_train(
            config,
            vision,
            train_data=args.train_data,
            val_data=args.val_data,
            score_workers=args.score_workers,
            score_timeout=args.score_timeout,
        )
    except (ConfigError, ValidationError) as err:
        parser.error(str(err))
    shown = {k: round(v, 4) for k, v in metrics.items() if k.startswith(("reward/", "val/", "mismatch/"))}
    print(f"last step: {shown}")


def _demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from rlloom_apps.vlm_geo3k.demo import before_after_table, run_demo

    from rlloom.core_rl.demo_cli import run_demo_command

    title = "rlloom vlm demo: GRPO on naming a colour (held-out, sampled)"
    run_demo_command(parser, args, run_demo, before_after_table, title=title)
