"""`search-agent warmup`: its flags (built without importing torch, so `--help` stays fast) and its run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rlloom_apps.search_agent.warmup_settings import WarmupSettings

from rlloom.core_rl.cli import HelpFormatter


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
    wu.add_argument("--model", required=True, type=Path, help="a transformers checkpoint folder (an instruct model)")
    wu.add_argument("--tokenizer", type=Path, default=None, help="its tokenizer folder, when not in --model")
    wu.add_argument("--train-data", required=True, type=Path, help="JSONL rows from prepare-data")
    wu.add_argument("--val-data", type=Path, default=None, help="held-out rows to measure before and after")
    wu.add_argument("--out", required=True, type=Path, help="folder for the warmed-up model, tokenizer, warmup.json")
    add_retrieval_args(wu, required=True)
    settings = wu.add_argument_group("warm-up settings (defaults shown per flag)")
    for name, field in WarmupSettings.model_fields.items():
        if name == "progress":
            continue
        kind = float if field.annotation is float else int
        settings.add_argument(f"--{name.replace('_', '-')}", type=kind, default=field.default, help=field.description)


def run_warmup_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from pydantic import ValidationError
    from rlloom_apps.search_agent.data import DataError, read_rows
    from rlloom_apps.search_agent.retrieval import check_retrieval

    from rlloom.rewards.eval_runner import flag_errors

    try:
        settings = WarmupSettings(**{k: getattr(args, k) for k in WarmupSettings.model_fields if k != "progress"})
    except ValidationError as err:
        parser.error(flag_errors(err))
    for flag, folder in (("--model", args.model), ("--tokenizer", args.tokenizer)):
        if folder is not None and not folder.is_dir():
            parser.error(f"{flag} {folder}: not a folder (a transformers checkpoint saved locally)")
    if args.out.is_file():
        parser.error(f"--out {args.out} is a file; give a folder for the warmed-up model")
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
    import dataclasses

    import torch
    from rlloom_apps.search_agent.retrieval import open_retriever
    from rlloom_apps.search_agent.warmup import warm_up
    from transformers import AutoModelForCausalLM

    from rlloom.core_rl.workers import load_pretrained_tokenizer

    tokenizer = load_pretrained_tokenizer(str(args.tokenizer or args.model))
    if tokenizer.chat_template is None:
        parser.error(f"the tokenizer of {args.model} has no chat template: give an instruct model (or --tokenizer)")
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32)
    if torch.cuda.is_available():
        torch.nn.Module.to(model, "cuda")  # transformers wraps `.to` with a signature mypy cannot follow
    with open_retriever(args.index, args.retrieval_url) as retriever:
        result = warm_up(model, tokenizer, train_rows, retriever, settings, val_rows=val_rows)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out))
    tokenizer.save_pretrained(str(args.out))
    summary = {"settings": settings.model_dump(), **dataclasses.asdict(result)}
    (args.out / "warmup.json").write_text(json.dumps(summary, indent=2) + "\n")
    return result
