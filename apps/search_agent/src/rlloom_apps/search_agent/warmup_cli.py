"""`search-agent warmup`: its flags (built without importing torch, so `--help` stays fast) and its run; the shared
flags, checks, model load and save are core-rl's (`rlloom.core_rl.workers.run_warmup`)."""

from __future__ import annotations

import argparse
from typing import Any

from rlloom_apps.search_agent.warmup_settings import WarmupSettings

from rlloom.core_rl.cli import HelpFormatter
from rlloom.core_rl.workers import add_settings_arguments, add_warmup_arguments

NOT_FLAGS = ("progress",)  # the bars stay on in a command


def add_warmup_parser(commands: Any, add_retrieval_args: Any) -> None:
    wu = commands.add_parser(
        "warmup",
        help="a cold start on real rows: supervised on Search-R1-format demonstrations before RL",
        description="Builds one demonstration per training row through the agent loop and the retriever (search "
        "the question, read the passages, answer the row's gold answer in Search-R1's tags), trains the model on "
        "its own turns, and saves it to --out for `search-agent train ... model.path=OUT`. With --val-data, "
        "prints greedy format validity, EM, F1 and searches on those rows before and after.",
        formatter_class=HelpFormatter,
    )
    add_warmup_arguments(
        wu, train_help="JSONL rows from prepare-data", val_help="held-out rows to measure before and after"
    )
    add_retrieval_args(wu, required=True)
    add_settings_arguments(wu, WarmupSettings, skip=NOT_FLAGS)


def run_warmup_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from rlloom_apps.search_agent.data import DataError, read_rows
    from rlloom_apps.search_agent.retrieval import check_retrieval

    from rlloom.core_rl.workers import check_warmup_flags
    from rlloom.rewards.eval_runner import flag_errors

    settings = check_warmup_flags(parser, args, WarmupSettings, flag_errors, skip=NOT_FLAGS)
    try:  # before the model loads
        train_rows = read_rows(args.train_data, "--train-data")
        val_rows = read_rows(args.val_data, "--val-data") if args.val_data is not None else None
        check_retrieval(args.index, args.retrieval_url)
    except (DataError, ValueError) as err:
        parser.error(str(err))
    result = _run(parser, args, settings, train_rows, val_rows)
    print(f"warm-up: {len(result.losses)} steps on {result.demonstrations} demonstrations", end="")
    print(f", loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}" if result.losses else "")
    if result.before is not None and result.after is not None:
        print(f"held-out before: {result.before.line()}\nheld-out after:  {result.after.line()}")
    print(f"saved to {args.out}; next: search-agent train ... model.path={args.out}")


def _run(
    parser: argparse.ArgumentParser, args: argparse.Namespace, settings: WarmupSettings, train_rows: Any, val_rows: Any
) -> Any:
    from rlloom_apps.search_agent.retrieval import open_retriever
    from rlloom_apps.search_agent.warmup import warm_up

    from rlloom.core_rl.workers import run_warmup

    def train(model: Any, tokenizer: Any) -> Any:  # the retriever opens once the model is loaded
        with open_retriever(args.index, args.retrieval_url) as retriever:
            return warm_up(model, tokenizer, train_rows, retriever, settings, val_rows=val_rows)

    return run_warmup(parser, args, settings, train)
