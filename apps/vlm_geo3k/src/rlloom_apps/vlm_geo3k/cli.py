"""`vlm-geo3k` console script: `prepare-data` (Geometry3K folders -> rows), `train` (GRPO on a Qwen2.5-VL),
`eval` (avg@n, pass@k, maj@k of a saved VLM) and `demo` (a tiny VLM learns a colour-naming task on synthetic
pictures, on CPU)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from rlloom.core_rl.cli import (
    HelpFormatter,
    add_demo_command,
    check_yaml,
    command_parser,
    parse,
    quiet_interrupt,
    run_interruptible,
)
from rlloom.core_rl.observe import add_plot_command, run_plot_command


def build_parser() -> argparse.ArgumentParser:
    from rlloom.rollout import add_engine_argument

    parser = argparse.ArgumentParser(
        prog="vlm-geo3k", description="VLM RL on Geometry3K.", formatter_class=HelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser(
        "prepare-data", help="convert Geometry3K problem folders to training rows", formatter_class=HelpFormatter
    )
    prep.add_argument(
        "--input", required=True, type=Path, help="folder of problem folders (each with data.json + img_diagram.png)"
    )
    prep.add_argument("--out", required=True, type=Path, help="output JSONL of training rows")
    prep.add_argument("--split", default="train", choices=["train", "val", "test"], help="recorded in extra_info")
    fit = commands.add_parser(
        "train",
        help="GRPO on prepared rows with the bundled EasyR1 config (or your YAML)",
        description="Train a Qwen2.5-VL with core-rl's Trainer: image prompts sampled from an HF engine on the "
        "actor (or vLLM: --engine vllm), scored by EasyR1's math reward (0.9 accuracy + 0.1 format). Extra "
        "arguments (anywhere among the options) are dotted config overrides, e.g. "
        "model.path=/models/Qwen2.5-VL-7B-Instruct vision.max_pixels=1003520 rollout.n=8.",
        formatter_class=HelpFormatter,
    )
    fit.add_argument("--config", default="grpo", help="grpo, or a YAML file")
    fit.add_argument("--train-data", required=True, type=Path, help="JSONL rows from prepare-data")
    fit.add_argument("--val-data", type=Path, default=None, help="JSONL rows for validation (default: none)")
    fit.add_argument("--score-workers", type=int, default=None, help="scoring processes (default: one per core)")
    fit.add_argument("--score-timeout", type=float, default=30.0, help="seconds per sample's scoring at most")
    add_engine_argument(fit)
    fit.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. actor.lr=1e-6")
    demo = add_demo_command(
        commands,
        help="a tiny VLM learns to name a square's colour from reward, on CPU (about 2.5 minutes)",
        description="Synthetic pictures, a supervised warm-up that stops early, then GRPO through the same wiring "
        "as train. Extra arguments are dotted config overrides, e.g. actor.lr=3e-4 rollout.n=16.",
        default_steps=40,
        seed_help="pictures, model, warm-up and training seed",
        run_prefix="vlm-demo",
    )
    demo.formatter_class = HelpFormatter
    _eval_parser(commands)
    add_plot_command(commands, "vlm-geo3k")
    return parser


@quiet_interrupt
def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse(parser, argv)
    parser = command_parser(parser, args)  # errors show `<app> <command>`'s usage line
    if args.command == "plot":
        run_plot_command(parser, args)
        return
    if args.command == "eval":
        _eval(parser, args)
        return
    if args.command == "train":
        _train(parser, args)
        return
    if args.command == "demo":
        _demo(parser, args)
        return
    from rlloom_apps.vlm_geo3k.data import DataError, prepare  # here: the multimodal package imports torch

    if not args.input.is_dir():
        parser.error(f"--input {args.input} is not a folder; give the folder of Geometry3K problem folders")
    if args.out.is_dir():
        parser.error(f"--out {args.out} is a folder; give a file path, e.g. {args.out / 'rows.jsonl'}")
    try:
        n = prepare(args.input, args.out, split=args.split)
    except DataError as err:
        parser.error(str(err))
    print(f"wrote {n} rows to {args.out}")


def _train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from pydantic import ValidationError
    from rlloom_apps.vlm_geo3k.preflight import check_rows, load_config

    from rlloom.core_rl.config import ConfigError
    from rlloom.core_rl.data import DataError
    from rlloom.rollout import engine_override, engine_problem

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for label, path in (("--train-data", args.train_data), ("--val-data", args.val_data)):
        if path is not None and not path.is_file():
            parser.error(f"{label} {path} does not exist (make rows with `vlm-geo3k prepare-data`)")
    if args.score_workers is not None and args.score_workers < 0:
        parser.error(f"--score-workers must be 0 (score in this process) or more, got {args.score_workers}")
    if args.score_timeout <= 0:
        parser.error(f"--score-timeout must be more than 0 seconds, got {args.score_timeout:g}")
    check_yaml(parser, args.config)
    try:
        config, vision = load_config(args.config, [*args.overrides, *engine_override(args.engine)])
    except (ConfigError, ValidationError) as err:
        parser.error(str(err))
    try:
        check_rows(args.train_data, args.val_data)  # every row's data_source names a scorer: still without torch
    except (ConfigError, DataError) as err:
        parser.error(str(err))
    from rlloom_apps.vlm_geo3k.train import run_train, vllm_options  # torch, transformers: once all checked out

    if problem := engine_problem(config, vllm_options(vision)):  # before any model loads
        parser.error(problem)
    try:
        metrics = run_interruptible(  # Ctrl-C: one line naming the step and the command that resumes, exit 130
            lambda: run_train(
                config,
                vision,
                train_data=args.train_data,
                val_data=args.val_data,
                score_workers=args.score_workers,
                score_timeout=args.score_timeout,
            ),
            config.trainer.output_dir,
        )
    except (ConfigError, ValidationError) as err:
        parser.error(str(err))
    shown = {k: round(v, 4) for k, v in metrics.items() if k.startswith(("reward/", "val/", "mismatch/"))}
    print(f"last step: {shown}")


def _eval_parser(commands: Any) -> None:
    from rlloom_apps.vlm_geo3k.settings import VisionSettings

    from rlloom.rewards.eval_runner import add_eval_arguments
    from rlloom.rollout import add_policy_arguments

    ev = commands.add_parser(
        "eval",
        help="sample n answers per problem from a saved VLM and report avg@n, pass@k and maj@k",
        description="Sample every prepared row n times (seeded) with its images, score each answer with the math "
        "checker on its last \\boxed{} (an unboxed answer scores 0), and print avg@n, unbiased pass@k and maj@k "
        "per dataset.",
        formatter_class=HelpFormatter,
    )
    ev.add_argument("--data", required=True, type=Path, nargs="+", help="JSONL rows from prepare-data")
    ev.add_argument("--limit", type=int, default=None, help="first N rows of each file (default: all)")
    ev.add_argument("--out", type=Path, default=None, help="folder for results.json, table.md and samples_*.jsonl")
    add_policy_arguments(ev, model_help="a saved VLM folder (a trainer checkpoint or a Qwen2.5-VL)")
    vision = ev.add_argument_group("images")
    for name in ("min_pixels", "max_pixels"):
        field = VisionSettings.model_fields[name]
        vision.add_argument(f"--{name.replace('_', '-')}", type=int, default=field.default, help=field.description)
    add_eval_arguments(ev)


def _eval(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from pydantic import ValidationError
    from rlloom_apps.vlm_geo3k.data import check_image_paths
    from rlloom_apps.vlm_geo3k.evaluate import vision_request
    from rlloom_apps.vlm_geo3k.settings import VisionSettings
    from transformers import AutoConfig

    from rlloom.core_rl.contracts import check_chat_template_kwargs
    from rlloom.rewards.eval_runner import (
        flag_errors,
        read_rows,
        report,
        run_eval,
        sampling_warnings,
        settings_from_args,
    )
    from rlloom.rollout import PolicySpec, build_engine, close_engine

    spec = PolicySpec.from_args(args)
    if spec.url is not None or spec.engine != "hf":
        # engine_inputs() holds processed pixel tensors, which only the in-process HF engine takes today
        parser.error("vlm-geo3k eval samples with the HF engine: pass --model with --engine hf (image requests to "
                     "vLLM or an HTTP server are not wired yet)")  # fmt: skip
    if args.limit is not None and args.limit < 0:
        parser.error(f"--limit must be 0 or more, got {args.limit}")
    if args.min_pixels > args.max_pixels:  # named by flag: VisionSettings would name the training config's keys
        parser.error(f"--min-pixels {args.min_pixels} exceeds --max-pixels {args.max_pixels}; lower --min-pixels")
    try:
        spec.check()
        settings = settings_from_args(args)
        check_chat_template_kwargs(settings.chat_template_kwargs, "--chat-template-kwargs")  # before the model loads
        vision = VisionSettings(min_pixels=args.min_pixels, max_pixels=args.max_pixels, max_prompt_tokens=None)
    except ValidationError as err:
        parser.error(flag_errors(err))
    except ValueError as err:
        parser.error(str(err))
    for warning in sampling_warnings(settings):
        print(f"warning: {warning}", file=sys.stderr)
    try:
        rows = read_rows(args.data, limit=args.limit, made_by="vlm-geo3k prepare-data")
        check_image_paths(rows, "--data")  # before the model loads, not mid-sampling
    except ValueError as err:
        parser.error(str(err))
    config_path = str(spec.model or spec.tokenizer)
    vision_config = getattr(AutoConfig.from_pretrained(config_path), "vision_config", None)
    if vision_config is None:
        parser.error(f"{config_path} is not a vision-language model (its config has no vision_config)")
    try:
        engine, tokenizer = build_engine(spec)
    except ValueError as err:
        parser.error(str(err))
    try:
        processing = vision.processing(vision_config, settings.chat_template_kwargs)
        request_for = vision_request(settings, tokenizer, processing)
        result = run_eval(engine, rows, settings, request_for)
    except ValueError as err:
        parser.error(str(err))
    finally:
        close_engine(engine)
    report(result, rows, settings, args.out)


def _demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from rlloom_apps.vlm_geo3k.demo import before_after_table, run_demo

    from rlloom.core_rl.cli import run_demo_command

    title = "rlloom vlm demo: GRPO on naming a colour (held-out, sampled)"
    run_demo_command(parser, args, run_demo, before_after_table, title=title)
