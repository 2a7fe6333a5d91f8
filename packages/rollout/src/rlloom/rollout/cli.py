"""`rlloom-rollout serve`: load a model folder into an engine and serve it over the OpenAI API."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlloom-rollout", description="rlloom rollout engines")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model folder as an OpenAI-compatible endpoint")
    serve.add_argument("--model", required=True, help="HF model folder (config, weights, tokenizer)")
    serve.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    serve.add_argument("--served-model-name", default=None, help="name clients pass as `model` (default: folder)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--device", default=None, help="hf engine: cpu, cuda, cuda:1 (default: cuda if present)")
    serve.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    serve.add_argument("--max-batch-rows", type=int, default=64, help="hf engine: samples per batch at most")
    serve.add_argument("--max-tokens", type=int, default=256, help="default max_tokens when a request omits it")
    serve.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm engine")
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vllm engine")
    return parser


def _build_engine(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch

    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    if args.engine == "vllm":
        from rlloom.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig

        cfg = VLLMEngineConfig(
            model=args.model,
            tensor_parallel_size=args.tensor_parallel_size,
            gpu_memory_utilization=args.gpu_memory_utilization,
            dtype=args.dtype,
        )
        vllm_engine = VLLMEngine(cfg)
        return vllm_engine, vllm_engine.tokenizer
    from rlloom.rollout.hf_engine import HFEngine, HFEngineConfig

    hf_engine = HFEngine.from_pretrained(
        args.model, dtype=dtype, device=args.device, config=HFEngineConfig(max_batch_rows=args.max_batch_rows)
    )
    return hf_engine, hf_engine.tokenizer


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if not Path(args.model).is_dir():
        raise SystemExit(f"--model {args.model}: not a folder; give a saved HF model folder")
    import uvicorn

    from rlloom.rollout.server import create_app

    engine, tokenizer = _build_engine(args)
    name = args.served_model_name or Path(args.model).name
    app = create_app(engine, name, tokenizer, default_max_tokens=args.max_tokens)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
