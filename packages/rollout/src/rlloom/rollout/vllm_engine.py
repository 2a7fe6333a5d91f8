"""`VLLMEngine`: a thin adapter on vLLM's offline `LLM` API for colocated GPU rollouts.

Written against vLLM's documented API for **vllm>=0.10.2,<0.12** (the `vllm` extra pins that range):
`LLM(..., enable_sleep_mode, enable_prefix_caching, logprobs_mode, worker_extension_cls)`, `LLM.generate` with
`TokensPrompt`, `LLM.sleep/wake_up`, `LLM.collective_rpc` and `LLM.reset_prefix_cache`. Weights are pushed
without touching disk: `collective_rpc` calls `rlloom_load_weights` (mixed into every worker through
`worker_extension_cls`, see `vllm_worker.py`), which feeds HF-named tensors to the model's own `load_weights`
so tensor-parallel sharding and fused QKV layouts are handled by vLLM. **Unverified here**: no machine this
project has can install vLLM (CUDA wheel, own torch pin), so its tests are marked `vllm` and skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from rlloom.core_rl.generation import Completion, FinishReason, GenerationRequest, SamplingParams
from rlloom.core_rl.prompts import render_prompt
from rlloom.core_rl.weight_sync import bucket_names
from rlloom.rollout.batching import AsyncBatcher

SUPPORTED_VLLM = ">=0.10.2,<0.12"


class VLLMEngineConfig(BaseModel):
    """Arguments for `vllm.LLM`, named as vLLM names them."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="HF model folder or name vLLM loads at start.")
    tokenizer: str | None = Field(default=None, description="Tokenizer folder or name (default: the model's).")
    tensor_parallel_size: int = Field(default=1, ge=1)
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1, description="Leave room for training.")
    dtype: str = Field(default="auto")
    max_model_len: int | None = Field(default=None, ge=1)
    enable_prefix_caching: bool = Field(default=True, description="Reuse KV of shared prompt prefixes (GRPO n).")
    enable_sleep_mode: bool = Field(default=True, description="Allow sleep()/wake_up() to free GPU memory.")
    enforce_eager: bool = Field(default=False, description="Skip CUDA graphs (faster start, slower decode).")
    seed: int = Field(default=0)
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field(
        default="processed_logprobs",
        description="processed: after temperature scaling, like HFEngine and the trainer's logits/T, but (in vLLM) "
        "also after top-k/top-p/min-p truncation, renormalised over the kept tokens: equal to HFEngine's only "
        "when those are off. raw: before temperature.",
    )
    weight_bucket_bytes: int = Field(default=512 << 20, ge=1 << 20, description="Bytes per weight-update RPC.")
    max_batch_rows: int = Field(default=256, ge=1, description="Samples per `agenerate` batch at most.")
    skip_special_tokens: bool = Field(
        default=True,
        description="Leave special tokens out of `text` (as HFEngineConfig's). False keeps markers that are special "
        "tokens, e.g. Mistral's [TOOL_CALLS], which the agent's mistral tool-call parser reads.",
    )


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            f"VLLMEngine needs vLLM {SUPPORTED_VLLM} and a CUDA GPU: pip install 'rlloom-rollout[vllm]'. "
            "On CPU use HFEngine."
        ) from exc
    return vllm


def vllm_sampling_kwargs(p: SamplingParams, *, skip_special_tokens: bool = True) -> dict[str, Any]:
    """Our `SamplingParams` as keyword arguments of `vllm.SamplingParams` (same names, vLLM's conventions)."""
    return {
        "n": p.n,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k if p.top_k > 0 else -1,  # vLLM: -1 disables
        "min_p": p.min_p,
        "max_tokens": p.max_tokens,
        "stop": list(p.stop) or None,
        "stop_token_ids": list(p.stop_token_ids) or None,
        "include_stop_str_in_output": p.include_stop_str_in_output,
        "ignore_eos": p.ignore_eos,
        "seed": p.seed,
        "logprobs": 0 if p.logprobs else None,  # 0: only the sampled token's logprob
        "detokenize": True,
        "skip_special_tokens": skip_special_tokens,
    }


def weight_buckets(named_tensors: Mapping[str, torch.Tensor], bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """Group tensors into lists of about `bucket_bytes` so each RPC carries a bounded payload."""
    sizes = {name: tensor.numel() * tensor.element_size() for name, tensor in named_tensors.items()}
    for names in bucket_names(sizes, bucket_bytes):
        yield [(name, named_tensors[name].detach()) for name in names]


def _max_model_len(llm: Any) -> int | None:
    """The context length vLLM settled on (config.max_model_len, else the model's own)."""
    value = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "max_model_len", None)
    return int(value) if value else None


class VLLMEngine:
    """vLLM in this process; implements core-rl's `RolloutEngine` plus `sleep`/`wake_up` for colocation."""

    def __init__(self, config: VLLMEngineConfig) -> None:
        vllm = _import_vllm()
        self.config = config
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=config.model,
            tokenizer=config.tokenizer,
            tensor_parallel_size=config.tensor_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            enable_prefix_caching=config.enable_prefix_caching,
            enable_sleep_mode=config.enable_sleep_mode,
            enforce_eager=config.enforce_eager,
            seed=config.seed,
            logprobs_mode=config.logprobs_mode,
            worker_extension_cls="rlloom.rollout.vllm_worker.WeightLoaderExtension",
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.context_window = _max_model_len(self.llm)
        self.asleep = False
        self._batcher = AsyncBatcher(self._run_batch, config.max_batch_rows)

    # -- RolloutEngine -------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Complete every request in one `LLM.generate` call (vLLM schedules the batch itself)."""
        results: list[list[Completion]] = [[] for _ in requests]

        def deliver(i: int, completions: list[Completion]) -> None:
            results[i] = completions

        self._run_batch(list(requests), deliver)
        return results

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        """Batched with other concurrent callers, like `HFEngine.agenerate`."""
        return await self._batcher.submit(request)

    def _run_batch(self, requests: list[GenerationRequest], deliver: Any) -> None:
        if self.asleep:
            raise RuntimeError("VLLMEngine is asleep: call wake_up() before generating")
        from vllm.inputs import TokensPrompt

        prompts = []
        for r in requests:
            prompt: dict[str, Any] = {"prompt_token_ids": render_prompt(self.tokenizer, r)}
            if r.multimodal:
                prompt["multi_modal_data"] = r.multimodal
            prompts.append(TokensPrompt(**prompt))  # type: ignore[typeddict-item]
        skip = self.config.skip_special_tokens
        kwargs = [vllm_sampling_kwargs(r.sampling, skip_special_tokens=skip) for r in requests]
        params = [self._vllm.SamplingParams(**kw) for kw in kwargs]
        started = time.perf_counter()
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        latency = time.perf_counter() - started
        for i, (request, out) in enumerate(zip(requests, outputs, strict=True)):
            deliver(i, [_completion(request, out.prompt_token_ids, c, latency) for c in out.outputs])

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Load HF-named tensors into every worker in buckets, then drop prefix-cache entries of old weights."""
        for bucket in weight_buckets(named_tensors, self.config.weight_bucket_bytes):
            self.llm.collective_rpc("rlloom_load_weights", args=(bucket,))
        self.llm.reset_prefix_cache()

    # -- colocation ----------------------------------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Free GPU memory for training: level 1 offloads weights to CPU and drops the KV cache; level 2
        drops the weights too (push new ones with update_weights after wake_up)."""
        if not self.config.enable_sleep_mode:
            raise RuntimeError("VLLMEngine.sleep needs enable_sleep_mode=True in VLLMEngineConfig")
        self.llm.sleep(level=level)
        self.asleep = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore memory; tags=["weights"] first then ["kv_cache"] keeps the peak low during a weight push."""
        self.llm.wake_up(tags=tags)
        self.asleep = tags is not None and "kv_cache" not in tags

    def close(self) -> None:
        self._batcher.close()


def _completion(request: GenerationRequest, prompt_ids: list[int], out: Any, latency: float) -> Completion:
    """One vLLM `CompletionOutput` as a `Completion`; the sampled token's logprob is picked from each step."""
    token_ids = [int(t) for t in out.token_ids]
    logprobs = None
    if request.sampling.logprobs and out.logprobs is not None:
        logprobs = [float(step[t].logprob) for step, t in zip(out.logprobs, token_ids, strict=True)]
    reason: FinishReason = out.finish_reason if out.finish_reason in ("stop", "length") else "abort"
    return Completion(
        request_id=request.request_id,
        prompt_ids=list(prompt_ids),
        token_ids=token_ids,
        text=out.text,
        finish_reason=reason,
        logprobs=logprobs,
        stop_reason=out.stop_reason,
        sample_index=int(out.index),
        timing={"latency_s": latency},
    )
