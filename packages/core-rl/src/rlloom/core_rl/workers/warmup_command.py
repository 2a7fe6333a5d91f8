"""The supervised warm-up as an app's `warmup` command: the settings and flags every app shares, their checks, and
the run that loads the instruct model, trains it on the app's demonstrations and saves it with warmup.json.

The apps differ only in how they build demonstrations (a row's worked solution, a conversation through the
retriever) and what they print; the rest is here once, so `reasoning warmup` and `search-agent warmup` take the
same flags, refuse the same mistakes with the same words, and write the same folder for `train ... model.path=OUT`.
Torch loads only in `run_warmup`: building the flags and checking them stays fast (`--help`, a typo).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

R = TypeVar("R")  # the app's result: a dataclass
S = TypeVar("S", bound=BaseModel)


class WarmupSettingsBase(BaseModel):
    """The supervised step's settings every app's warm-up takes (`supervised_train`'s knobs, and which rows); an app's
    `WarmupSettings` extends it with how long to train (epochs or steps) and what it measures. Its fields come first
    among the app's flags."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(
        default=1e-5, gt=0, description="AdamW learning rate (a fine-tuning rate for a pretrained model)."
    )
    batch_size: int = Field(default=8, ge=1, description="Demonstrations per step.")
    # = supervised.DEFAULT_MICRO_BATCH_TOKENS (a test holds them equal); that module imports torch, this one must not
    max_tokens_per_micro_batch: int = Field(
        default=1024,
        ge=1,
        description="Tokens per forward/backward: a step's rows run in micro-batches of this many tokens (the "
        "loss is the same; memory grows with it: SmolLM2-135M float32 keeps ~1.5 MB of activations per token).",
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute activations in backward: less memory, about a third more compute (off unless given).",
    )
    max_rows: int | None = Field(
        default=None, ge=1, description="Demonstrate the first N training rows only (all unless given)."
    )
    seed: int = Field(default=0, description="Batch order seed.")


def add_warmup_arguments(parser: argparse.ArgumentParser, *, train_help: str, val_help: str) -> None:
    """--model, --tokenizer, --train-data, --val-data and --out."""
    parser.add_argument(
        "--model", required=True, type=Path, help="a transformers checkpoint folder (an instruct model)"
    )
    parser.add_argument("--tokenizer", type=Path, default=None, help="its tokenizer folder, when not in --model")
    parser.add_argument("--train-data", required=True, type=Path, help=train_help)
    parser.add_argument("--val-data", type=Path, default=None, help=val_help)
    parser.add_argument(
        "--out", required=True, type=Path, help="folder for the warmed-up model, tokenizer, warmup.json"
    )


def add_settings_arguments(
    parser: argparse.ArgumentParser, settings: type[BaseModel], *, skip: Collection[str] = ()
) -> None:
    """One flag per field of `settings` (`batch_size` -> --batch-size), its default and description shown: a number
    takes a value, a bool is an on/off pair (--gradient-checkpointing / --no-gradient-checkpointing); the fields in
    `skip` are not flags."""
    group = parser.add_argument_group("warm-up settings (defaults shown per flag)")
    for name, field in settings.model_fields.items():
        if name in skip:
            continue
        flag = f"--{name.replace('_', '-')}"
        if field.annotation is bool:
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=field.default, help=field.description
            )
            continue
        kind = float if field.annotation is float else int
        group.add_argument(flag, type=kind, default=field.default, help=field.description)


def check_warmup_flags(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    settings: type[S],
    describe: Callable[[ValidationError], str],
    *,
    skip: Collection[str] = (),
) -> S:
    """The settings from their flags (a bad value is `describe`d by its flag) and the folders checked, before
    anything loads; returns the settings."""
    try:
        chosen = settings(**{k: getattr(args, k) for k in settings.model_fields if k not in skip})
    except ValidationError as err:
        parser.error(describe(err))
    for flag, folder in (("--model", args.model), ("--tokenizer", args.tokenizer)):
        if folder is not None and not folder.is_dir():
            parser.error(f"{flag} {folder}: not a folder (a transformers checkpoint saved locally)")
    if args.out.is_file():
        parser.error(f"--out {args.out} is a file; give a folder for the warmed-up model")
    return chosen


def run_warmup(
    parser: argparse.ArgumentParser, args: argparse.Namespace, settings: BaseModel, train: Callable[[Any, Any], R]
) -> R:
    """Load --model in float32 (on CUDA when there is one) with its tokenizer, run `train(model, tokenizer)`, and
    save both to --out with warmup.json: the settings and `train`'s result (a dataclass)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

    tokenizer = load_pretrained_tokenizer(str(args.tokenizer or args.model))
    if tokenizer.chat_template is None:
        parser.error(f"the tokenizer of {args.model} has no chat template: give an instruct model (or --tokenizer)")
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32)
    if torch.cuda.is_available():
        torch.nn.Module.to(model, "cuda")  # transformers wraps `.to` with a signature mypy cannot follow
    result = train(model, tokenizer)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out))
    tokenizer.save_pretrained(str(args.out))
    summary = {"settings": settings.model_dump(), **dataclasses.asdict(cast(Any, result))}
    (args.out / "warmup.json").write_text(json.dumps(summary, indent=2) + "\n")
    return result
