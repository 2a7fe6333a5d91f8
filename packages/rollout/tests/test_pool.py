"""RolloutPool: dispatch by pending tokens, weight broadcast, restart of a dead replica (threads; Ray if present)."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Sequence
from typing import Any

import pytest

from rlloom.core_rl.contracts.dispatch import assign_by_tokens, request_tokens
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine
from rlloom.rollout.pool import RolloutPool


def _reqs(encode: Any, k: int, **kw: Any) -> list[GenerationRequest]:
    return [
        GenerationRequest(prompt_ids=encode(f"prompt {i}"), sampling=SamplingParams(seed=i, max_tokens=8, **kw))
        for i in range(k)
    ]


def test_assignment_balances_pending_tokens() -> None:
    # hand-worked: largest first to the least loaded; loads start at 10 and 0
    assert assign_by_tokens([5, 30, 20, 7], [10, 0]) == [1, 1, 0, 0]
    assert assign_by_tokens([1, 1, 1], [0, 0, 0]) == [0, 1, 2]


def test_request_tokens_counts_prompt_budget_and_samples() -> None:
    r = GenerationRequest(prompt_ids=[1, 2, 3], sampling=SamplingParams(n=4, max_tokens=10))
    assert request_tokens(r) == 52


def test_pool_matches_a_single_engine_and_uses_every_replica(tok: Any, encode: Any) -> None:
    reqs = _reqs(encode, 8)
    pool = RolloutPool(lambda: HFEngine(tiny_qwen2(tok), tok), replicas=2, backend="thread")
    try:
        got = pool.generate(reqs)
        assert pool.dispatched == [4, 4] and pool.pending_tokens == [0, 0]
    finally:
        pool.close()
    alone = HFEngine(tiny_qwen2(tok), tok).generate(reqs)
    assert [[c.token_ids for c in g] for g in got] == [[c.token_ids for c in a] for a in alone]


def test_agenerate_spreads_concurrent_callers(tok: Any, encode: Any) -> None:
    pool = RolloutPool(lambda: HFEngine(tiny_qwen2(tok), tok), replicas=2, backend="thread")

    async def run() -> list[list[Completion]]:
        return await asyncio.gather(*(pool.agenerate(r) for r in _reqs(encode, 10)))

    try:
        out = asyncio.run(run())
    finally:
        pool.close()
    assert len(out) == 10 and all(len(o[0].token_ids) >= 1 for o in out)
    assert min(pool.dispatched) >= 3


class _CrashingEngine(HFEngine):
    """An engine whose device 'dies' on its first batch (as a CUDA error or OOM would)."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_dead_replica_is_restarted_with_latest_weights_and_requests_retried(
    tok: Any, encode: Any, peaked_state: Any
) -> None:
    made: list[str] = []

    def factory() -> HFEngine:
        kind = _CrashingEngine if len(made) == 1 else HFEngine  # the second replica built is faulty
        made.append(kind.__name__)
        return kind(tiny_qwen2(tok), tok)

    pool = RolloutPool(factory, replicas=2, backend="thread")
    weights = peaked_state(tok, seed=8)
    try:
        pool.update_weights(weights)
        reqs = _reqs(encode, 6, ignore_eos=True)
        got = pool.generate(reqs)
    finally:
        pool.close()
    assert made == ["HFEngine", "_CrashingEngine", "HFEngine"] and pool.restarts == 1
    reference = tiny_qwen2(tok)
    reference.load_state_dict(weights, strict=False)
    expected = HFEngine(reference, tok).generate(reqs)
    assert [g[0].token_ids for g in got] == [e[0].token_ids for e in expected]


class _DiesOnWeightPush(HFEngine):
    """An engine whose device died between batches: the next call it gets, a weight push, fails."""

    def update_weights(self, named_tensors: Any) -> None:
        raise RuntimeError("CUDA error: device-side assert triggered")


def test_replica_dead_at_a_weight_push_is_restarted_with_the_new_weights(
    tok: Any, encode: Any, peaked_state: Any
) -> None:
    """A Ray actor that died is first seen by the trainer's weight push: the pool rebuilds it (as generate
    does) rather than failing the step with the replica's raw error."""
    made: list[str] = []

    def factory() -> HFEngine:
        kind = _DiesOnWeightPush if not made else HFEngine
        made.append(kind.__name__)
        return kind(tiny_qwen2(tok), tok)

    pool = RolloutPool(factory, replicas=1, backend="thread")
    weights = peaked_state(tok, seed=8)
    reqs = _reqs(encode, 3, ignore_eos=True)
    try:
        pool.update_weights(weights)
        got = pool.generate(reqs)
    finally:
        pool.close()
    assert made == ["_DiesOnWeightPush", "HFEngine"] and pool.restarts == 1
    reference = tiny_qwen2(tok)
    reference.load_state_dict(weights, strict=False)
    expected = HFEngine(reference, tok).generate(reqs)
    assert [g[0].token_ids for g in got] == [e[0].token_ids for e in expected]


def test_request_errors_propagate_without_restart(tok: Any) -> None:
    pool = RolloutPool(lambda: HFEngine(tiny_qwen2(tok, max_position_embeddings=8), tok), replicas=1)
    try:
        with pytest.raises(ValueError, match="context"):
            pool.generate([GenerationRequest(prompt_ids=list(range(10, 30)))])
        assert pool.restarts == 0
    finally:
        pool.close()


def test_restart_budget_is_enforced(tok: Any, encode: Any) -> None:
    pool = RolloutPool(lambda: _CrashingEngine(tiny_qwen2(tok), tok), replicas=1, max_restarts=2)
    try:
        with pytest.raises(RuntimeError, match="all 2 restarts"):
            pool.generate(_reqs(encode, 1))
    finally:
        pool.close()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (extra `ray`)")
def test_ray_replicas(tok: Any, encode: Any, peaked_state: Any) -> None:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        pool = RolloutPool(lambda: HFEngine(tiny_qwen2(tok), tok), replicas=2, call_timeout_s=120)
        assert pool.backend == "ray"
        reqs = _reqs(encode, 4)
        got = pool.generate(reqs)
        pool.update_weights(peaked_state(tok, seed=3))
        pool.close()
    finally:
        ray.shutdown()
    alone = HFEngine(tiny_qwen2(tok), tok).generate(reqs)
    assert [g[0].token_ids for g in got] == [a[0].token_ids for a in alone]


def test_pool_reports_its_replicas_context_window_and_eos_ids(tok: Any) -> None:
    """AgentLoop caps conversations at `engine.context_window` and reads `eos_token_ids`: a pool must pass
    them on, or conversations on a pool outgrow the model and fail the run."""
    model = tiny_qwen2(tok, max_position_embeddings=96)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")]
    pool = RolloutPool(lambda: HFEngine(model, tok), replicas=2, backend="thread")
    try:
        assert pool.context_window == 96
        assert pool.eos_token_ids == {
            tok.convert_tokens_to_ids("<|im_end|>"),
            tok.convert_tokens_to_ids("<|endoftext|>"),
        }
    finally:
        pool.close()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (extra `ray`)")
def test_ray_replica_that_cannot_be_placed_is_a_clear_error_and_frees_the_others(tok: Any) -> None:
    """Two replicas of one CPU each on a one-CPU cluster: the second stays pending. The pool must say what it
    asked for (not a bare GetTimeoutError) and release the first one's CPU."""
    import time

    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        with pytest.raises(TimeoutError, match=r"did not start within 5 s.*'num_cpus': 1.*ray_actor_options"):
            RolloutPool(
                lambda: HFEngine(tiny_qwen2(tok), tok), replicas=2, ray_actor_options={"num_cpus": 1}, call_timeout_s=5
            )
        deadline = time.monotonic() + 30
        while ray.available_resources().get("CPU", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ray.available_resources().get("CPU", 0) == 1
    finally:
        ray.shutdown()
