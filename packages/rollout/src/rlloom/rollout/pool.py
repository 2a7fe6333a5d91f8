"""`RolloutPool`: N engine replicas behind one dispatcher, itself a `RolloutEngine`.

Requests go to the replica with the fewest pending tokens (prompt plus `max_tokens`, times n), so a replica
stuck with long generations is not handed more. Replicas are Ray actors when Ray is initialised (one GPU each,
across nodes) and threads in this process otherwise (torch releases the GIL, so CPU replicas use separate
cores). Weight updates are broadcast to every replica and remembered, so a replica that dies is rebuilt from
the factory, given the latest weights, and its requests (or its share of a weight push) are retried. Request
errors (`ValueError`, `KeyError`, `TypeError`) are the caller's fault and propagate without a restart.
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
    `HasContextWindow`, `HasEosTokens` and `Closable` (the replicas' other capabilities, e.g. vLLM's sleep mode,
    stay with them: the pool neither sleeps nor labels its replicas' syncs)."""

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
        engine_info = self._replicas[0].describe()
        self.context_window = engine_info["context_window"]
        self.eos_token_ids = engine_info["eos_token_ids"]
        self.dispatch = ReplicaDispatcher(replicas)
        self._threads = ThreadPoolExecutor(max_workers=replicas, thread_name_prefix="rlloom-pool")

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
            if self._latest_weights is not None:
                fresh.update_weights(self._latest_weights)
            self._replicas[index] = fresh
            return fresh

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
        list(self._threads.map(lambda index: self._push(index, shared), range(len(self._replicas))))

    def _push(self, index: int, shared: Any) -> None:
        """One replica's share of a broadcast. A replica that died since its last call is rebuilt (and given
        every weight pushed so far) instead of failing the trainer's step, as `generate` does."""
        replica = self._replicas[index]
        try:
            replica.update_weights(shared)
        except _CALLER_ERRORS:
            raise
        except Exception as exc:
            self._restart(index, replica, exc)

    def close(self) -> None:
        """Close every replica and the dispatcher threads."""
        for replica in self._replicas:
            replica.close()
        self._threads.shutdown(wait=True)

    @property
    def size(self) -> int:
        return len(self._replicas)
