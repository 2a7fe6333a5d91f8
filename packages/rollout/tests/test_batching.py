"""The request queues behind `agenerate`: answers reach their own callers, failures stay with theirs.

`AsyncBatcher` is the step-wise queue `VLLMEngine` uses (vLLM is not installable here), so it is driven by a
plain batch function that answers each request with its own id; `ContinuousBatcher` is exercised end to end
through `HFEngine` in test_continuous_batching.py.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.rollout.batching import AsyncBatcher, ContinuousBatcher


def _req(i: int) -> GenerationRequest:
    return GenerationRequest(request_id=f"r{i}", prompt_ids=[i + 1], sampling=SamplingParams(max_tokens=1))


def _echo(request: GenerationRequest) -> list[Completion]:
    assert request.prompt_ids is not None
    return [Completion(request.request_id, list(request.prompt_ids), [request.prompt_ids[0] * 10], "x", "stop")]


async def _call_all(batcher: Any, requests: list[GenerationRequest]) -> list[Any]:
    return await asyncio.gather(*(batcher.submit(r) for r in requests), return_exceptions=True)


def test_step_wise_batches_respect_the_row_budget_and_answer_each_caller() -> None:
    sizes: list[int] = []
    release = threading.Event()

    def run_batch(requests: list[GenerationRequest], deliver: Any) -> None:
        release.wait(timeout=5)  # hold the first batch so the others queue up behind it
        sizes.append(len(requests))
        for i, r in enumerate(requests):
            deliver(i, _echo(r))

    batcher = AsyncBatcher(run_batch, max_rows=4, gather_s=0.05)
    reqs = [_req(i) for i in range(10)]

    async def run() -> list[Any]:
        task = asyncio.ensure_future(_call_all(batcher, reqs))
        await asyncio.sleep(0.1)
        release.set()
        return await task

    out = asyncio.run(run())
    batcher.close()
    assert [o[0].token_ids for o in out] == [[(i + 1) * 10] for i in range(10)]
    assert max(sizes) <= 4 and sum(sizes) == 10 and len(sizes) < 10


def test_a_failing_batch_fails_only_its_callers_and_the_worker_survives() -> None:
    def run_batch(requests: list[GenerationRequest], deliver: Any) -> None:
        for i, r in enumerate(requests):
            if r.request_id == "r3":
                raise RuntimeError("backend broke on r3")
            deliver(i, _echo(r))

    batcher = AsyncBatcher(run_batch, max_rows=64, gather_s=0.05)
    first = asyncio.run(_call_all(batcher, [_req(i) for i in range(5)]))
    later = asyncio.run(_call_all(batcher, [_req(7)]))
    batcher.close()
    assert [o[0].token_ids for o in first[:3]] == [[10], [20], [30]]  # answered before the failure
    assert all(isinstance(o, RuntimeError) and "r3" in str(o) for o in first[3:])
    assert later[0][0].token_ids == [80]


def test_a_runner_that_forgets_a_caller_fails_it_instead_of_hanging() -> None:
    def run(take: Any) -> None:
        for ticket in take(64):
            if ticket.request.request_id != "r1":
                ticket.deliver(_echo(ticket.request))

    batcher = ContinuousBatcher(run, max_rows=64, gather_s=0.05)
    out = asyncio.run(_call_all(batcher, [_req(0), _req(1)]))
    batcher.close()
    assert out[0][0].token_ids == [10]
    assert isinstance(out[1], RuntimeError) and "without answering" in str(out[1])


def test_take_stops_at_a_request_the_runner_refuses() -> None:
    taken: list[list[str]] = []

    def run(take: Any) -> None:
        while True:
            tickets = take(64, lambda r: r.request_id != "r2")
            if not tickets:
                tickets = take(64)  # the refused one, once the others are done
            if not tickets:
                return
            taken.append([t.request.request_id for t in tickets])
            for t in tickets:
                t.deliver(_echo(t.request))

    batcher = ContinuousBatcher(run, max_rows=64, gather_s=0.05)
    asyncio.run(_call_all(batcher, [_req(i) for i in range(4)]))
    batcher.close()
    assert taken[0] == ["r0", "r1"]  # arrival order kept: r3 does not jump ahead of the refused r2
    assert taken[1] == ["r2", "r3"]


def test_submit_after_close_is_refused() -> None:
    batcher = ContinuousBatcher(lambda take: None, max_rows=4)
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(batcher.submit(_req(0)))


def test_step_wise_batches_skip_requests_whose_caller_was_cancelled() -> None:
    """A caller that gave up while queued (a timeout) is not sent to the engine; the others are answered."""
    seen: list[str] = []
    release = threading.Event()

    def run_batch(requests: list[GenerationRequest], deliver: Any) -> None:
        release.wait(timeout=5)  # hold the first batch so the next requests queue up behind it
        seen.extend(r.request_id for r in requests)
        for i, r in enumerate(requests):
            deliver(i, _echo(r))

    batcher = AsyncBatcher(run_batch, max_rows=1, gather_s=0.0)

    async def run() -> list[Any]:
        first = asyncio.ensure_future(batcher.submit(_req(0)))  # one row of room: r0's batch holds the worker
        dropped = asyncio.ensure_future(batcher.submit(_req(1)))
        kept = asyncio.ensure_future(batcher.submit(_req(2)))
        await asyncio.sleep(0)
        dropped.cancel()
        with pytest.raises(asyncio.CancelledError):
            await dropped
        release.set()
        return [await first, await kept]

    out = asyncio.run(run())
    batcher.close()
    assert [o[0].token_ids for o in out] == [[10], [30]]
    assert seen == ["r0", "r2"]
