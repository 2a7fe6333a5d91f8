"""`reasoning` console script: `demo` (a tiny model end to end on CPU), `prepare-data`, `warmup`, `train`, `eval`,
`filter-rows`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rlloom_apps.reasoning.data import FIELDS, MBPP_SPLITS, DataError, prepare
from rlloom_apps.reasoning.filter_rows import add_filter_parser, run_filter_command
from rlloom_apps.reasoning.sampling_flags import add_sampling_arguments, sample_and_score
from rlloom_apps.reasoning.warmup_cli import add_warmup_parser, run_warmup_command

from rlloom.core_rl.cli import (
    HelpFormatter,
    add_demo_command,
    check_file_arguments,
    check_yaml,
    command_parser,
    parse,
    quiet_interrupt,
    run_interruptible,
)
from rlloom.core_rl.observe import add_plot_command, run_plot_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reasoning",
        description="RL with verifiable rewards for math (GSM8K, MATH-500, AIME) and code (HumanEval, MBPP).",
        formatter_class=HelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser(
        "prepare-data", help="convert a math or code dataset (JSONL) to training rows", formatter_class=HelpFormatter
    )
    prep.add_argument("--dataset", required=True, choices=sorted(FIELDS), help="which dataset --input holds")
    prep.add_argument("--input", required=True, type=Path, help="source JSONL (or .jsonl.gz), e.g. gsm8k/test.jsonl")
    prep.add_argument("--out", required=True, type=Path, help="output JSONL of training rows")
    prep.add_argument(
        "--split",
        default="test",
        help=f"recorded in extra_info; for mbpp it picks the task-id range ({', '.join(MBPP_SPLITS)})",
    )
    prep.add_argument("--limit", type=int, default=None, help="keep only the first N rows (default: all)")
    demo = add_demo_command(
        commands,
        help="train a tiny model end to end on CPU (warm-up, then GRPO with held-out validation)",
        description="Supervised warm-up, then GRPO on digit reversal with rlloom's trainer, HF engine and a "
        "rewards Rubric (exact answer + digits in place). Extra arguments are dotted trainer-config "
        "overrides, e.g. actor.lr=5e-4 rollout.n=4.",
        default_steps=150,
        seed_help="model initialisation, warm-up and training seed",
        run_prefix="demo",
    )
    demo.formatter_class = HelpFormatter
    _eval_parser(commands)
    add_filter_parser(commands)
    add_warmup_parser(commands)
    _train_parser(commands)
    add_plot_command(commands, "reasoning")
    return parser


@quiet_interrupt
def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse(parser, argv)
    parser = command_parser(parser, args)  # errors show `<app> <command>`'s usage line
    if args.command == "plot":
        run_plot_command(parser, args)
        return
    if args.command == "demo":
        _demo(parser, args)
        return
    if args.command == "eval":
        _eval(parser, args)
        return
    if args.command == "filter-rows":
        run_filter_command(parser, args)
        return
    if args.command == "train":
        _train(parser, args)
        return
    if args.command == "warmup":
        run_warmup_command(parser, args)
        return
    _prepare(parser, args)


def _prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    check_file_arguments(parser, args.input, args.out, f"{args.dataset}.jsonl")
    try:
        n = prepare(args.dataset, args.input, args.out, split=args.split, limit=args.limit)
    except DataError as err:
        parser.error(str(err))
    print(f"wrote {n} rows to {args.out}")


def _demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from rlloom_apps.reasoning.demo import run_demo
    from rlloom_apps.reasoning.demo_report import before_after_table

    from rlloom.core_rl.cli import run_demo_command

    run_demo_command(parser, args, run_demo, before_after_table, title="rlloom demo: GRPO on digit reversal")


def _eval_parser(commands: Any) -> None:
    ev = commands.add_parser(
        "eval",
        help="sample n responses per problem and report avg@n, pass@k and maj@k per dataset",
        description="Sample every prepared row n times (seeded), score each sample with its data source's scorer "
        "(math checker, sandboxed HumanEval/MBPP tests), and print avg@n, unbiased pass@k and maj@k per dataset.",
        formatter_class=HelpFormatter,
    )
    ev.add_argument("--out", type=Path, default=None, help="folder for results.json, table.md and samples_*.jsonl")
    add_sampling_arguments(ev)


def _eval(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from rlloom.rewards.eval_runner import report

    rows, settings, result = sample_and_score(parser, args)
    report(result, rows, settings, args.out)


def _train_parser(commands: Any) -> None:
    from rlloom_apps.reasoning.bundled import ALGORITHMS

    from rlloom.rollout import add_engine_argument

    fit = commands.add_parser(
        "train",
        help="RL on prepared rows with a bundled algorithm config (or your YAML)",
        description="Train with core-rl's Trainer: rollouts from an HF engine on the actor (or vLLM: --engine vllm), "
        "each sample scored by its row's data_source scorer. Extra arguments (anywhere among the options) are "
        "dotted config overrides, e.g. model.path=/models/x actor.lr=5e-7 rollout.n=8.",
        formatter_class=HelpFormatter,
    )
    fit.add_argument(
        "--config",
        default=None,
        help=f"{', '.join(ALGORITHMS)}, or a YAML file (default: grpo); ppo when veRL's algorithm.adv_estimator=gae "
        "is among the overrides, as veRL's PPO scripts set it",
    )
    fit.add_argument(
        "--train-data",
        type=Path,
        default=None,
        help="rows from prepare-data, JSONL or parquet (or veRL's data.train_files=FILE or a list of files)",
    )
    fit.add_argument(
        "--val-data",
        type=Path,
        default=None,
        help="rows for validation (or veRL's data.val_files=FILE or a list) (default: none)",
    )
    fit.add_argument(
        "--score-workers", type=int, default=None, help="scoring processes, 1 or more (default: one per core)"
    )
    fit.add_argument("--score-timeout", type=float, default=30.0, help="seconds per sample's scoring at most")
    fit.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved config and the veRL keys mapped or set aside, check the data files' rows, and exit "
        "without loading torch or a model",
    )
    add_engine_argument(fit)
    fit.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. actor.lr=5e-7")


def _default_config(overrides: list[str]) -> str:
    """The bundled config a command line without --config starts from: ppo (one sample per prompt, a critic, KL in
    the reward, as veRL's ppo_trainer defaults) when veRL's `algorithm.adv_estimator=gae` is typed, else grpo."""
    gae = any(
        item.replace(" ", "") in ("algorithm.adv_estimator=gae", "+algorithm.adv_estimator=gae") for item in overrides
    )
    return "ppo" if gae else "grpo"


def _train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    import yaml
    from pydantic import ValidationError
    from rlloom_apps.reasoning.preflight import check_rows, load_train_config
    from rlloom_apps.reasoning.train_files import check_files, read_data_files

    from rlloom.core_rl.config import ConfigError
    from rlloom.core_rl.config.compat import CommandLine
    from rlloom.core_rl.data import DataError
    from rlloom.rollout import engine_override, engine_problem

    try:  # veRL's data.train_files / val_files (one file or a list) stand in for the flags
        files = read_data_files(args.overrides, args.train_data, args.val_data)
        check_files(files.labelled(), "reasoning prepare-data")  # exists, has the columns: named per file
    except (ConfigError, DataError) as err:
        parser.error(str(err))
    if args.score_workers is not None and args.score_workers < 1:
        # training scores in worker processes kept for the whole run (a scorer that hangs or crashes cannot take
        # the run with it); unlike `reasoning eval`, there is no in-process mode
        parser.error(f"--score-workers must be 1 or more (scoring processes), got {args.score_workers}")
    if args.score_timeout <= 0:
        parser.error(f"--score-timeout must be more than 0 seconds, got {args.score_timeout:g}")
    config_name = args.config or _default_config(args.overrides)
    check_yaml(parser, config_name)
    from rlloom.core_rl.config.compat import read_verl_infrastructure

    try:
        read = read_verl_infrastructure(files.rest, CommandLine(mapped=files.mapped))  # nnodes=1 ...: listed, not lost
        config = load_train_config(config_name, [*read.overrides, *engine_override(args.engine)])
    except yaml.YAMLError as err:
        parser.error(f"an override's value is not valid YAML ({str(err).splitlines()[0]}); quote it")
    except (ConfigError, ValidationError) as err:
        parser.error(str(err))
    if not args.dry_run and (problem := engine_problem(config)):  # vLLM loads torch: not in a dry run
        parser.error(problem)
    try:
        check_rows(None, files=files.labelled())  # every row's data_source names a scorer: still without torch
    except (ConfigError, DataError) as err:
        parser.error(str(err))
    if args.dry_run:
        print(f"# reasoning train --dry-run: the resolved config (from {config_name})")
        print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False).rstrip())
        print(f"# train data: {', '.join(map(str, files.train))} (rows checked)")
        print(f"# val data: {', '.join(map(str, files.val)) or 'none'}")
        for line in read.summary():
            print(f"#   {line}")
        print("# not checked without loading torch: the model folder and the rollout engine (vLLM)")
        return
    for line in read.summary():  # once, never silently
        print(f"config: {line}", file=sys.stderr)
    from rlloom_apps.reasoning.train import run_train  # torch, transformers: only once everything checked out

    try:
        metrics = run_interruptible(  # Ctrl-C: one line naming the step and the command that resumes, exit 130
            lambda: run_train(
                config,
                train_data=files.train,
                val_data=files.val or None,
                score_workers=args.score_workers,
                score_timeout=args.score_timeout,
            ),
            config.trainer.output_dir,
        )
    except (ConfigError, ValidationError, DataError) as err:
        parser.error(str(err))
    shown = {k: round(v, 4) for k, v in metrics.items() if k.startswith(("reward/", "val/"))}
    print(f"last step: {shown}")
