"""`VLLMAsyncEngine`: vLLM's `AsyncLLM` for agent turns, so a conversation joins the running batch the moment
its tool call returns instead of waiting for the batch before it to finish (`VLLMEngine.agenerate` batches
step-wise on the offline `LLM`).

`AsyncLLM` binds itself to the event loop it is created in, while agents and trainers call from loops of their
own (each `asyncio.run` is a new one), so the engine owns a loop on a background thread and every call is handed
to it; `agenerate` awaits the answer without blocking its caller's loop. Weight sync, its deadlines and errors are
`VLLMEngine`'s (`vllm.weights.WeightSync` over `collective_rpc`); a sync waits for no request, so push
weights between rollouts, as the trainer does.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.rollout.vllm.engine import (
    VLLMEngineConfig,
    _completion,
    multimodal_kwargs,
    prepare_platform,
    scheduler_kwargs,
    vllm_sampling_kwargs,
)
from rlloom.rollout.vllm.images import ImagePatchLayout, check_expanded, engine_prompt
from rlloom.rollout.vllm.weights import WeightSync, WeightSyncSession

T = TypeVar("T")


class VLLMAsyncEngine:
    """`AsyncLLM` on a loop of its own (start it under `__main__`); implements core-rl's `RolloutEngine` and the
    capabilities `VLLMEngine` has: `SleepMode`, `WeightSyncLifecycle`, `WeightSyncCount`, `HasContextWindow`,
    `HasTokenizer` and `Closable`."""

    tokenizer: Any
    context_window: int | None

    def __init__(self, config: VLLMEngineConfig) -> None:
        vllm, self.on_cpu, self.supports_sleep = prepare_platform(config)
        self.config = config
        self._vllm = vllm
        self.image_layout = ImagePatchLayout.from_model(config.model)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rlloom-vllm-async", daemon=True)
        self._thread.start()
        self.llm: Any = self._run(self._start())
        self.tokenizer = self.llm.get_tokenizer()
        value = getattr(getattr(self.llm, "model_config", None), "max_model_len", None)
        self.context_window = int(value) if value else None
        self._ids = itertools.count()
        self._sync = WeightSync(
            WeightSyncSession(self._rpc, timeout_s=config.sync_timeout_s),
            bucket_bytes=config.weight_bucket_bytes,
            on_finish=self._drop_weight_caches,
        )

    async def _start(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        c = self.config
        args = AsyncEngineArgs(
            model=c.model,
            tokenizer=c.tokenizer,
            tensor_parallel_size=c.tensor_parallel_size,
            gpu_memory_utilization=c.gpu_memory_utilization,
            dtype=c.dtype,
            max_model_len=c.max_model_len,
            enable_prefix_caching=c.enable_prefix_caching,
            enable_sleep_mode=self.supports_sleep,
            enforce_eager=c.enforce_eager,
            seed=c.seed,
            logprobs_mode=c.logprobs_mode,
            worker_extension_cls="rlloom.rollout.vllm.worker.WeightLoaderExtension",
            **scheduler_kwargs(c, on_cpu=self.on_cpu),
            **multimodal_kwargs(c, self.image_layout),
        )
        return AsyncLLM.from_engine_args(args)

    def _submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._submit(coro).result()

    def _rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return list(self._run(self.llm.collective_rpc(method, args=args)))

    # -- RolloutEngine -------------------------------------------------------------------------------------
    async def _one(self, request: GenerationRequest) -> list[Completion]:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        prompt = engine_prompt(request, self.tokenizer, self.image_layout)
        params = self._vllm.SamplingParams(
            **vllm_sampling_kwargs(
                request.sampling,
                skip_special_tokens=self.config.skip_special_tokens,
                logit_bias=self.image_layout.logit_bias() if self.image_layout else None,
            )
        )
        params.output_kind = RequestOutputKind.FINAL_ONLY
        request_id = f"{request.request_id}-{next(self._ids)}"
        started = time.perf_counter()
        final = None
        async for out in self.llm.generate(TokensPrompt(**prompt), params, request_id):  # type: ignore[typeddict-item]
            final = out
        if final is None:
            raise RuntimeError(f"vLLM returned no output for request {request.request_id}")
        latency = time.perf_counter() - started
        prompt_ids = list(final.prompt_token_ids or [])
        if request.multimodal:
            check_expanded(request.request_id, request.prompt_ids or [], prompt_ids)
        return [_completion(request, prompt_ids, c, latency) for c in final.outputs]

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        """One request, scheduled by vLLM alongside every other in flight (continuous batching)."""
        if self._sync.pending:
            await asyncio.to_thread(self._sync.ready)
        future = self._submit(self._one(request))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # the engine's task is cancelled too, which aborts the request in vLLM
            raise

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Every request submitted at once; answers in request order."""
        self._sync.ready()

        async def all_of() -> list[list[Completion]]:
            return list(await asyncio.gather(*(self._one(r) for r in requests)))

        return self._run(all_of())

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """As `VLLMEngine.update_weights`: buckets into an open sync, closed before the next generation."""
        self._sync.load(named_tensors)

    def begin_weight_sync(self, step: int) -> None:
        self._sync.begin(step)

    def finish_weight_sync(self) -> None:
        self._sync.finish()

    def _drop_weight_caches(self) -> None:
        self._run(self.llm.reset_prefix_cache())
        if self.image_layout is not None:  # cached vision-tower outputs of old weights
            self._run(self.llm.reset_encoder_cache())

    @property
    def weight_syncs(self) -> int:
        return self._sync.completed

    # -- colocation ----------------------------------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """As `VLLMEngine.sleep`: a no-op where vLLM has no sleep mode."""
        if self.supports_sleep:
            self.finish_weight_sync()
            self._run(self.llm.sleep(level=level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        if self.supports_sleep:
            self._run(self.llm.wake_up(tags=tags))

    def close(self) -> None:
        """Shut vLLM's engine-core process down and stop the loop thread."""
        self.llm.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
