"""`RolloutPool`: N engine replicas behind one dispatcher, itself a `RolloutEngine`.

Requests go to the replica with the fewest pending tokens (prompt plus `max_tokens`, times n), so a replica
stuck with long generations is not handed more. Replicas are Ray actors when Ray is initialised (one GPU each,
across nodes) and threads in this process otherwise (torch releases the GIL, so CPU replicas use separate
cores). Weight updates are broadcast to every replica and remembered, so a replica that dies is rebuilt from
the factory, given the latest weights, and its requests (or its share of a weight push) are retried. Request
errors (`ValueError`, `KeyError`, `TypeError`) are the caller's fault and propagate without a restart.

When every replica takes weights in flight (core-rl's `InflightWeightUpdate`: HF, vLLM's async engine), the pool
is an `InflightRolloutPool`, which pauses and resumes them all (`trainer.mode=async` pushes weights that way); over
other replicas it stays a plain `RolloutPool`, so `isinstance(pool, InflightWeightUpdate)` is false and the
trainer's fallback (waiting for the requests in progress) applies. Broadcasts (weights, pause, resume) run on
threads of their own, never queued behind generation calls that a paused replica holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import torch

from rlloom.core_rl.contracts.dispatch import ReplicaDispatcher, by_replica
from rlloom.core_rl.contracts.engines import RolloutEngine
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.rollout.pool_replicas import LocalReplica, RayReplica, Replica, ray_is_initialized

_CALLER_ERRORS = (ValueError, KeyError, TypeError)


class RolloutPool:
    """Dispatches requests over engine replicas made by `engine_factory`; implements `RolloutEngine`,
    `HasContextWindow`, `HasEosTokens` and `Closable`, and `InflightWeightUpdate` when every replica does (it is
    then an `InflightRolloutPool`). The replicas' other capabilities, e.g. vLLM's sleep mode, stay with them: the
    pool neither sleeps nor labels its replicas' syncs."""

    context_window: int | None
    """The replicas' context length (agent loops cap conversations at it); None when they name none."""
    eos_token_ids: frozenset[int] | None
    """The replicas' EOS ids (the tokenizer's and the model's generation config's), when they report them."""

    def __init__(
        self,
        engine_factory: Callable[[], RolloutEngine],
        replicas: int = 2,
        *,
        backend: Literal["auto", "thread", "ray"] = "auto",
        max_restarts: int = 3,
        ray_actor_options: Mapping[str, Any] | None = None,
        call_timeout_s: float = 3600.0,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"RolloutPool: replicas={replicas}; need at least 1")
        self.backend = ("ray" if ray_is_initialized() else "thread") if backend == "auto" else backend
        if self.backend == "ray" and not ray_is_initialized():
            raise RuntimeError("RolloutPool(backend='ray') needs ray.init() first (pip install rlloom-rollout[ray])")
        self._factory = engine_factory
        self._ray_options = dict(ray_actor_options or {})
        self._timeout = call_timeout_s
        self.max_restarts = max_restarts
        self.restarts = 0
        self._lock = threading.Lock()
        self._latest_weights: Mapping[str, torch.Tensor] | None = None
        self._replicas: list[Replica] = []
        try:
            for _ in range(replicas):
                self._replicas.append(self._spawn())
        except BaseException:
            for made in self._replicas:  # a replica that cannot start must not leave the others holding GPUs
                made.close()
            raise
        # replicas come from one factory: the first one's context window and EOS ids are the pool's
        described = [replica.describe() for replica in self._replicas]
        self.context_window = described[0]["context_window"]
        self.eos_token_ids = described[0]["eos_token_ids"]
        self.dispatch = ReplicaDispatcher(replicas)
        self._threads = ThreadPoolExecutor(max_workers=replicas, thread_name_prefix="rlloom-pool")
        self._broadcasts = ThreadPoolExecutor(max_workers=replicas, thread_name_prefix="rlloom-pool-broadcast")
        self._paused = False
        self._version: int | None = None  # the last resume's policy version
        if type(self) is RolloutPool and all("inflight_weight_update" in d["capabilities"] for d in described):
            # the capability is known once the replicas describe themselves: the pool becomes the subclass
            # that forwards it (as core-rl's rank proxy is built with exactly its replicas' capabilities)
            self.__class__ = InflightRolloutPool
            self._keeps_kv_cache = all(bool(d.get("keeps_kv_cache")) for d in described)

    @property
    def pending_tokens(self) -> list[int]:
        """Tokens each replica has been handed and not yet answered."""
        return self.dispatch.pending_tokens

    @property
    def dispatched(self) -> list[int]:
        """Requests sent to each replica so far."""
        return self.dispatch.dispatched

    def _spawn(self) -> Replica:
        if self.backend == "ray":
            return RayReplica(self._factory, self._ray_options, self._timeout)
        return LocalReplica(self._factory())

    def _restart(self, index: int, dead: Replica, error: BaseException) -> Replica:
        """Replace a failed replica (once, even if several callers saw it fail) and give it the latest weights."""
        with self._lock:
            if self._replicas[index] is not dead:
                return self._replicas[index]  # someone else already restarted it
            if self.restarts >= self.max_restarts:
                raise RuntimeError(
                    f"RolloutPool: replica {index} failed ({type(error).__name__}: {error}) and the pool has "
                    f"used all {self.max_restarts} restarts (raise max_restarts or fix the engine)"
                ) from error
            self.restarts += 1
            dead.close()
            fresh = self._spawn()
            self._bring_up(fresh)
            self._replicas[index] = fresh
            return fresh

    def _bring_up(self, fresh: Replica) -> None:
        """A restarted replica joins with every weight pushed so far."""
        if self._latest_weights is not None:
            fresh.update_weights(self._latest_weights)

    # -- RolloutEngine -------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Split the batch over replicas by pending tokens, run the parts in parallel, keep request order."""
        owner, costs = self.dispatch.assign(requests)
        parts = by_replica(owner)
        futures = {
            r: self._threads.submit(self._run_part, r, [requests[i] for i in idx], sum(costs[i] for i in idx))
            for r, idx in parts.items()
        }
        results: list[list[Completion]] = [[] for _ in requests]
        for r, fut in futures.items():
            for i, completions in zip(parts[r], fut.result(), strict=True):
                results[i] = completions
        return results

    def _run_part(self, index: int, requests: list[GenerationRequest], cost: int) -> list[list[Completion]]:
        try:
            while True:
                replica = self._replicas[index]
                try:
                    return replica.generate(requests)
                except _CALLER_ERRORS:
                    raise
                except Exception as exc:
                    self._restart(index, replica, exc)
        finally:
            self.dispatch.release(index, cost)

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        """Send one request to the least-loaded replica; on a replica failure restart it and retry."""
        index, cost = self.dispatch.pick(request)
        try:
            while True:
                replica = self._replicas[index]
                try:
                    return await replica.agenerate(request)
                except _CALLER_ERRORS:
                    raise
                except Exception as exc:
                    self._restart(index, replica, exc)
        finally:
            self.dispatch.release(index, cost)

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Broadcast to all replicas in parallel; the weights are kept for replicas restarted later."""
        # a push may be one bucket of the weights: keep the union for replicas restarted later
        self._latest_weights = {**(self._latest_weights or {}), **named_tensors}
        shared = RayReplica.put(named_tensors) if self.backend == "ray" else named_tensors
        self._broadcast(lambda replica: replica.update_weights(shared))

    def _broadcast(self, call: Callable[[Replica], None]) -> None:
        """`call` on every replica at once, on the broadcast threads (free while generation calls wait on a paused
        replica). A replica that died since its last call is rebuilt (given every weight pushed so far, and the
        pause state) instead of failing the trainer's step, as `generate` does."""
        list(self._broadcasts.map(lambda index: self._on_replica(index, call), range(len(self._replicas))))

    def _on_replica(self, index: int, call: Callable[[Replica], None]) -> None:
        replica = self._replicas[index]
        try:
            call(replica)
        except _CALLER_ERRORS:
            raise
        except Exception as exc:
            self._restart(index, replica, exc)

    def close(self) -> None:
        """Close every replica and the dispatcher threads."""
        for replica in self._replicas:
            replica.close()
        self._threads.shutdown(wait=True)
        self._broadcasts.shutdown(wait=True)

    @property
    def size(self) -> int:
        return len(self._replicas)


class InflightRolloutPool(RolloutPool):
    """A `RolloutPool` whose replicas all take weights in flight, and so does the pool (`InflightWeightUpdate`):
    `pause_generation` returns once every replica's requests stopped at a token boundary, `resume_generation`
    labels every replica's next tokens with the version. A replica restarted after a death comes up paused while
    the pool is, else resumed at the latest version. `RolloutPool(...)` builds it when the replicas allow."""

    _keeps_kv_cache: bool

    def pause_generation(self) -> None:
        with self._lock:
            self._paused = True
        self._broadcast(lambda replica: replica.pause_generation())

    def resume_generation(self, policy_version: int) -> None:
        with self._lock:
            self._paused, self._version = False, policy_version
        self._broadcast(lambda replica: replica.resume_generation(policy_version))

    @property
    def keeps_kv_cache(self) -> bool:
        """True when every replica keeps its paused requests' KV cache."""
        return self._keeps_kv_cache

    def _bring_up(self, fresh: Replica) -> None:
        super()._bring_up(fresh)
        if self._paused:
            fresh.pause_generation()
        elif self._version is not None:
            fresh.resume_generation(self._version)
