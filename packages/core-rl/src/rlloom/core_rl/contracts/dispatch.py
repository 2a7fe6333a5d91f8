"""Spreading generation requests over engine replicas by the tokens they will occupy: one dispatcher
(`ReplicaDispatcher`) for the rollout package's `RolloutPool` and core-rl's engines on ranks
(`distributed.rank_engines`), which differ only in how they reach a replica."""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence

from rlloom.core_rl.contracts.generation import GenerationRequest


def request_tokens(request: GenerationRequest) -> int:
    """Tokens a request will occupy at most: (prompt + max_tokens) x n; chat prompts estimated at 4 chars/token."""
    if request.prompt_ids is not None:
        prompt = len(request.prompt_ids)
    else:
        prompt = sum(len(str(m.get("content", ""))) for m in request.messages or []) // 4 + 1
    return (prompt + request.sampling.max_tokens) * request.sampling.n


def assign_by_tokens(costs: Sequence[int], loads: Sequence[int]) -> list[int]:
    """Replica index for each request: largest first, each to the replica with the least pending tokens."""
    heap = [(load, r) for r, load in enumerate(loads)]
    heapq.heapify(heap)
    out = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        load, r = heapq.heappop(heap)
        out[i] = r
        heapq.heappush(heap, (load + costs[i], r))
    return out


class ReplicaDispatcher:
    """Which replica gets each request, and the pending tokens and requests dispatched per replica behind it.

    A request is charged to its replica when dispatched (`assign`, `pick`) and released when answered, failed or
    not (`release`), so a replica stuck with long generations is not handed more. Thread-safe: the pool's
    dispatcher threads and an event loop's turns share it."""

    def __init__(self, replicas: int) -> None:
        self.pending_tokens = [0] * replicas
        self.dispatched = [0] * replicas  # requests sent to each replica so far
        self._lock = threading.Lock()

    def assign(self, requests: Sequence[GenerationRequest]) -> tuple[list[int], list[int]]:
        """A batch: (replica of each request, its tokens), largest first to the least loaded; all charged."""
        costs = [request_tokens(r) for r in requests]
        with self._lock:
            owner = assign_by_tokens(costs, self.pending_tokens)
            for r, cost in zip(owner, costs, strict=True):
                self.pending_tokens[r] += cost
                self.dispatched[r] += 1
        return owner, costs

    def pick(self, request: GenerationRequest) -> tuple[int, int]:
        """One request (an agent turn): (the replica with the fewest pending tokens, the request's tokens), charged."""
        cost = request_tokens(request)
        with self._lock:
            replica = min(range(len(self.pending_tokens)), key=lambda r: self.pending_tokens[r])
            self.pending_tokens[replica] += cost
            self.dispatched[replica] += 1
        return replica, cost

    def release(self, replica: int, tokens: int) -> None:
        """`tokens` of `replica`'s charge are done (answered or failed)."""
        with self._lock:
            self.pending_tokens[replica] -= tokens


def by_replica(owner: Sequence[int]) -> dict[int, list[int]]:
    """Request indices grouped by replica (in request order), from `ReplicaDispatcher.assign`'s owners."""
    parts: dict[int, list[int]] = {}
    for i, r in enumerate(owner):
        parts.setdefault(r, []).append(i)
    return parts


__all__ = ["ReplicaDispatcher", "assign_by_tokens", "by_replica", "request_tokens"]
