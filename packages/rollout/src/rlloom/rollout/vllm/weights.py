"""Driver-side weight sync for the vLLM engines: buckets of tensors, every RPC under a deadline, and the one
lifecycle (`WeightSync`) that `VLLMEngine`, `VLLMAsyncEngine` and `VLLMServerEngine` share.

When vLLM runs its engine core in another process (its default), `collective_rpc` carries msgpack, not tensors,
so each bucket is encoded once here (`encode_bucket`, in-memory safetensors) and decoded in the worker
(`vllm_worker.decode_bucket`). In-process (`vllm_inprocess.py`) the RPC is a method call and the bucket's list of
(name, tensor) goes through as it is (`pass_tensors`): the worker hands the trainer's tensors to `load_weights`.
A session is opened by the first bucket and closed before the next generation (or by `finish`): layers are
processed in the worker as soon as all their tensors have arrived, so buckets may cut a fused layer's
q/k/v apart. Any failure, a timeout included, leaves the session marked failed and the engine refusing to
generate until a later sync completes, so a rollout never runs silently on stale or half-loaded weights.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from rlloom.core_rl.workers.weight_sync import bucket_names


class WeightSyncError(RuntimeError):
    """A weight sync that did not complete; the engine refuses to generate until one does."""


class SyncDeadlineError(WeightSyncError):
    """A call past its deadline; `still_running` is its future (the call itself cannot be stopped)."""

    def __init__(self, message: str, still_running: concurrent.futures.Future[Any]) -> None:
        super().__init__(message)
        self.still_running = still_running


def weight_buckets(named_tensors: Mapping[str, torch.Tensor], bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """Group tensors into lists of about `bucket_bytes` so each RPC carries a bounded payload."""
    sizes = {name: tensor.numel() * tensor.element_size() for name, tensor in named_tensors.items()}
    for names in bucket_names(sizes, bucket_bytes):
        yield [(name, named_tensors[name].detach()) for name in names]


def encode_bucket(bucket: list[tuple[str, torch.Tensor]]) -> bytes:
    """One bucket as safetensors bytes (CPU, contiguous; tied tensors are written once per name)."""
    from safetensors.torch import save

    return save({name: t.detach().to("cpu").contiguous().clone() for name, t in bucket})


def call_with_deadline(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Run `fn` in a helper thread and give up after `timeout_s` seconds (vLLM's own RPC timeout is not enforced
    by every executor, and a blocked engine core would otherwise block the trainer for good)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlloom-vllm-sync")
    future = pool.submit(fn)
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise SyncDeadlineError(f"{what} timed out after {timeout_s:g} s", future) from None
    finally:
        pool.shutdown(wait=False)


def pass_tensors(bucket: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """An in-process worker's payload: the bucket itself (detached views of the trainer's tensors, no copy)."""
    return bucket


class WeightSyncSession:
    """The state of one engine's weight updates: open session, step label, last failure.

    `encode` turns a bucket into what `rpc` can carry: `encode_bucket` (bytes) across processes, `pass_tensors`
    within one."""

    def __init__(
        self,
        rpc: Callable[..., list[Any]],
        *,
        timeout_s: float,
        encode: Callable[[list[tuple[str, torch.Tensor]]], Any] = encode_bucket,
    ) -> None:
        self._rpc = rpc
        self._encode = encode
        self._running: concurrent.futures.Future[Any] | None = None  # an RPC past its deadline, maybe still busy
        self.timeout_s = timeout_s
        self.step: int | None = None  # the training step the current/next sync belongs to (set by the trainer)
        self.open = False
        self.buckets = 0
        self.completed = 0  # syncs finished since the engine started
        # the policy version the engine's weights are: the step of the last labelled sync (0 before any), which
        # every sampled token carries (`Completion.policy_versions`)
        self.policy_version = 0
        self.failure: str | None = None

    def _where(self) -> str:
        step = f"training step {self.step}" if self.step is not None else f"sync #{self.completed + 1}"
        return f"weight sync ({step})"

    def _call(self, method: str, what: str, *args: Any) -> list[Any]:
        if self._running is not None and not self._running.done():
            # in-process the timed-out call keeps changing the model in its thread: never run a second beside it
            raise WeightSyncError(
                f"{what} refused: a weight-sync call that passed its deadline is still running in the engine; "
                "retry when it has returned (the engine refuses to generate until a full sync succeeds)"
            )
        self._running = None
        try:
            return list(call_with_deadline(lambda: self._rpc(method, args=args), self.timeout_s, what))
        except Exception as exc:
            self._running = exc.still_running if isinstance(exc, SyncDeadlineError) else None
            self.open = False
            self.failure = f"{what} failed: {exc}"
            raise WeightSyncError(
                f"{self.failure}. The engine refuses to generate until a full sync succeeds."
            ) from exc

    def load(self, named_tensors: Mapping[str, torch.Tensor], bucket_bytes: int) -> None:
        """Send the tensors a bucket at a time, opening a session first if none is open."""
        if not self.open:
            self.buckets = 0
            self._call("rlloom_start_weight_update", f"{self._where()}: opening the session")
            self.open = True
        for bucket in weight_buckets(named_tensors, bucket_bytes):
            self.buckets += 1
            first, last = bucket[0][0], bucket[-1][0]
            what = f"{self._where()}, bucket {self.buckets} ({len(bucket)} tensors, {first} .. {last})"
            self._call("rlloom_load_weights", what, self._encode(bucket))

    def finish(self) -> bool:
        """Close an open session (process pending layers); True if there was one."""
        if not self.open:
            return False
        self._call("rlloom_finish_weight_update", f"{self._where()}: finishing after {self.buckets} bucket(s)")
        self.open = False
        self.failure = None
        self.completed += 1
        if self.step is not None:
            self.policy_version = self.step
        self.step = None
        return True

    def check_ready(self) -> None:
        """Raise if the last sync failed (its weights may be stale or half-loaded)."""
        if self.failure is not None:
            raise WeightSyncError(
                f"refusing to generate: {self.failure}. Push the full weights again with update_weights."
            )


class WeightSync:
    """An engine's weight-sync lifecycle (core-rl's `WeightSyncLifecycle` and `WeightSyncCount`), written once for
    the three vLLM engines: tensors go into an open session `bucket_bytes` at a time (`load`), `begin` labels the
    session with its training step, `finish` closes it and then runs `on_finish` (the engine's own cache resets),
    and `ready` closes an open session and refuses after a failed one, before any generation.

    Every step holds `lock`: pass the engine's own when generation holds it too (`VLLMEngine`), so a sync never
    interleaves with a generation."""

    def __init__(
        self,
        session: WeightSyncSession,
        *,
        bucket_bytes: int,
        lock: threading.RLock | None = None,
        on_finish: Callable[[], None] | None = None,
    ) -> None:
        self.session = session
        self.bucket_bytes = bucket_bytes
        self.lock = lock if lock is not None else threading.RLock()
        self._on_finish = on_finish

    def load(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Load HF-named tensors (all of them, or one bucket of the trainer's) into the open session; raises
        `WeightSyncError` naming the step and bucket on failure or timeout."""
        if not named_tensors:
            return
        with self.lock:
            self.session.load(named_tensors, self.bucket_bytes)

    def begin(self, step: int) -> None:
        """Label the coming sync with the training step, so an error names it."""
        with self.lock:
            self.session.step = step

    def finish(self) -> None:
        """Close an open session (the worker processes its pending layers), then drop the engine's caches of the
        old weights (`on_finish`); nothing when no session is open."""
        with self.lock:
            if self.session.finish() and self._on_finish is not None:
                self._on_finish()

    @property
    def completed(self) -> int:
        """Syncs completed since the engine started."""
        return self.session.completed

    @property
    def policy_version(self) -> int:
        """The version the weights are (the last labelled sync's step; 0 before any), for the sampled tokens."""
        return self.session.policy_version

    @property
    def pending(self) -> bool:
        """A session is open or the last one failed: `ready` has work to do before the next generation."""
        return self.session.open or self.session.failure is not None

    def ready(self) -> None:
        """Before generating: close an open session; raise `WeightSyncError` if the last sync failed."""
        with self.lock:
            self.finish()
            self.session.check_ready()
