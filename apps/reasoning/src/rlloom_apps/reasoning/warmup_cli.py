"""`reasoning warmup`: its flags (built without importing torch, so `--help` and flag errors stay fast) and its run."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from rlloom_apps.reasoning.warmup_settings import WarmupSettings

from rlloom.core_rl.cli import HelpFormatter


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
    wu.add_argument("--model", required=True, type=Path, help="a transformers checkpoint folder (an instruct model)")
    wu.add_argument("--tokenizer", type=Path, default=None, help="its tokenizer folder, when not in --model")
    wu.add_argument("--train-data", required=True, type=Path, help="JSONL (or parquet) rows from prepare-data")
    wu.add_argument("--val-data", type=Path, default=None, help="held-out rows whose demonstration loss is shown")
    wu.add_argument("--out", required=True, type=Path, help="folder for the warmed-up model, tokenizer, warmup.json")
    settings = wu.add_argument_group("warm-up settings (defaults shown per flag)")
    for name, field in WarmupSettings.model_fields.items():
        kind = float if field.annotation is float else int
        settings.add_argument(f"--{name.replace('_', '-')}", type=kind, default=field.default, help=field.description)


def run_warmup_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from pydantic import ValidationError
    from rlloom_apps.reasoning.warmup_rows import demonstrations

    from rlloom.core_rl.data import DataError, read_jsonl
    from rlloom.rewards.eval_runner import flag_errors

    try:
        settings = WarmupSettings(**{k: getattr(args, k) for k in WarmupSettings.model_fields})
    except ValidationError as err:
        parser.error(flag_errors(err))
    for flag, folder in (("--model", args.model), ("--tokenizer", args.tokenizer)):
        if folder is not None and not folder.is_dir():
            parser.error(f"{flag} {folder}: not a folder (a transformers checkpoint saved locally)")
    if args.out.is_file():
        parser.error(f"--out {args.out} is a file; give a folder for the warmed-up model")
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
    import torch
    from rlloom_apps.reasoning.warmup import warm_up_rows
    from transformers import AutoModelForCausalLM

    from rlloom.core_rl.workers import load_pretrained_tokenizer

    tokenizer = load_pretrained_tokenizer(str(args.tokenizer or args.model))
    if tokenizer.chat_template is None:
        parser.error(f"the tokenizer of {args.model} has no chat template: give an instruct model (or --tokenizer)")
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32)
    if torch.cuda.is_available():
        torch.nn.Module.to(model, "cuda")  # transformers wraps `.to` with a signature mypy cannot follow
    result = warm_up_rows(model, tokenizer, train, settings, val=val)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out))
    tokenizer.save_pretrained(str(args.out))
    summary = {"settings": settings.model_dump(), **dataclasses.asdict(result)}
    (args.out / "warmup.json").write_text(json.dumps(summary, indent=2) + "\n")
    return result
