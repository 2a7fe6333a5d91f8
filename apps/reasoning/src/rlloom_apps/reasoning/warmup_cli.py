"""`reasoning warmup`: its flags (built without importing torch, so `--help` and flag errors stay fast) and its run;
the shared flags, checks, model load and save are core-rl's (`rlloom.core_rl.workers.run_warmup`)."""

from __future__ import annotations

import argparse
from typing import Any

from rlloom_apps.reasoning.warmup_settings import WarmupSettings

from rlloom.core_rl.cli import HelpFormatter
from rlloom.core_rl.workers import add_settings_arguments, add_warmup_arguments


def add_warmup_parser(commands: Any) -> None:
    wu = commands.add_parser(
        "warmup",
        help="a cold start on real rows: supervised on the rows' worked solutions, each ending in \\boxed{answer}",
        description="Builds one demonstration per training row from its worked solution (prepare-data keeps it in "
        "extra_info.solution: GSM8K, MATH-500): the reasoning, then 'The final answer is \\boxed{gold}', the form "
        "the reward reads. Trains the model on them (the prompt rendered with its chat template, loss on the "
        "answer and EOS only) and saves it to --out for `reasoning train ... model.path=OUT`. With --val-data, "
        "prints the loss on those rows' demonstrations before and after.",
        formatter_class=HelpFormatter,
    )
    add_warmup_arguments(
        wu,
        train_help="JSONL (or parquet) rows from prepare-data",
        val_help="held-out rows whose demonstration loss is shown",
    )
    add_settings_arguments(wu, WarmupSettings)


def run_warmup_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from rlloom_apps.reasoning.warmup_rows import demonstrations

    from rlloom.core_rl.data import DataError, read_jsonl
    from rlloom.core_rl.workers import check_warmup_flags
    from rlloom.rewards.eval_runner import flag_errors

    settings = check_warmup_flags(parser, args, WarmupSettings, flag_errors)
    try:  # every data problem before torch and the model load
        shown: dict[str, list[Any]] = {}
        for flag, path in (("--train-data", args.train_data), ("--val-data", args.val_data)):
            if path is None:
                continue
            if not path.is_file():
                parser.error(f"{flag} {path} does not exist (make rows with `reasoning prepare-data`)")
            rows = list(read_jsonl(path))
            if flag == "--train-data" and settings.max_rows is not None:
                rows = rows[: settings.max_rows]
            built, skipped = demonstrations(rows)
            if skipped:
                print(f"{flag}: {skipped} of {len(rows)} rows have no extra_info.solution; skipped")
            shown[flag] = built
    except (DataError, ValueError) as err:  # DemonstrationError is a ValueError naming the field
        parser.error(f"{err}")
    result = _run(parser, args, settings, shown["--train-data"], shown.get("--val-data"))
    print(f"warm-up: {result.steps} steps on {result.demonstrations} demonstrations", end="")
    print(f", loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}" if result.losses else "")
    if result.heldout_before is not None and result.heldout_after is not None:
        print(f"held-out demonstration loss: {result.heldout_before:.3f} -> {result.heldout_after:.3f}")
    print(f"saved to {args.out}; next: reasoning train --train-data ... model.path={args.out}")


def _run(
    parser: argparse.ArgumentParser, args: argparse.Namespace, settings: WarmupSettings, train: Any, val: Any
) -> Any:
    from rlloom_apps.reasoning.warmup import warm_up_rows

    from rlloom.core_rl.workers import run_warmup

    return run_warmup(
        parser, args, settings, lambda model, tokenizer: warm_up_rows(model, tokenizer, train, settings, val=val)
    )
