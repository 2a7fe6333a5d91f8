"""Spreading generation requests over engine replicas by the tokens they will occupy: one rule for the rollout
package's `RolloutPool` and core-rl's engines on ranks (`distributed.rank_engines`)."""

from __future__ import annotations

import heapq
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


__all__ = ["assign_by_tokens", "request_tokens"]
