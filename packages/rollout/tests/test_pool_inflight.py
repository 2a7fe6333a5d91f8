"""RolloutPool under in-flight weight updates (core-rl's `InflightWeightUpdate`, issue 42): a pool of HF replicas
pauses and resumes them all, the tokens after the resume carry the new version, a replica restarted after a death
comes up at the pool's state (paused, or resumed at the latest version), and a pool over replicas that cannot pause
is not an `InflightWeightUpdate`, so the trainer falls back to waiting for its requests."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch

from rlloom.core_rl.contracts.engines import InflightWeightUpdate
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig
from rlloom.rollout.pool import InflightRolloutPool, RolloutPool

MAX_TOKENS = 200


def _greedy(encode: Any, text: str, max_tokens: int = MAX_TOKENS) -> GenerationRequest:
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return GenerationRequest(prompt_ids=encode(text), sampling=sampling)


def _wait_for(condition: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _in_thread(pool: RolloutPool, request: GenerationRequest, into: dict[str, list[Completion]], name: str) -> Any:
    thread = threading.Thread(target=lambda: into.update({name: asyncio.run(pool.agenerate(request))}))
    thread.start()
    return thread


def test_a_pool_of_hf_replicas_pauses_them_all_and_labels_the_resumed_tokens(tok: Any, encode: Any) -> None:
    engines: list[HFEngine] = []

    def factory() -> HFEngine:
        engines.append(HFEngine(tiny_qwen2(tok), tok, HFEngineConfig(gather_s=0.0)))
        return engines[-1]

    pool = RolloutPool(factory, replicas=2, backend="thread")
    results: dict[str, list[Completion]] = {}
    try:
        assert isinstance(pool, InflightRolloutPool) and isinstance(pool, InflightWeightUpdate) and pool.keeps_kv_cache
        callers = [_in_thread(pool, _greedy(encode, f"{i}+1="), results, str(i)) for i in (0, 1)]
        _wait_for(lambda: min(e.decode_stats.steps for e in engines) >= 3)  # one request on each replica
        pool.pause_generation()
        parked = [e.decode_stats.steps for e in engines]
        time.sleep(0.3)
        assert [e.decode_stats.steps for e in engines] == parked and not results  # neither decodes while paused
        norm = engines[0].model.get_parameter("model.norm.weight")
        pool.update_weights({"model.norm.weight": torch.full_like(norm, 2.0)})  # while paused: no wait
        pool.resume_generation(7)
        for caller in callers:
            caller.join(120)
    finally:
        pool.close()
    assert pool.dispatched == [1, 1]
    for name in ("0", "1"):
        versions = results[name][0].policy_versions
        assert versions is not None and len(versions) == MAX_TOKENS
        k = versions.index(7)
        assert k >= 3 and versions == [0] * k + [7] * (MAX_TOKENS - k)
    assert all(torch.equal(e.model.get_parameter("model.norm.weight"), torch.full_like(norm, 2.0)) for e in engines)


class _NoInflight:
    """A whole engine that cannot update in flight (as an HTTP engine without pause): generate, agenerate and
    update_weights of an HFEngine, and nothing else."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        return self.engine.generate(requests)

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        return await self.engine.agenerate(request)

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        self.engine.update_weights(named_tensors)


def test_a_pool_over_replicas_that_cannot_pause_is_not_inflight(tok: Any) -> None:
    made: list[Any] = []

    def mixed() -> Any:  # one replica that can pause, one that cannot
        made.append(HFEngine(tiny_qwen2(tok), tok) if not made else _NoInflight(HFEngine(tiny_qwen2(tok), tok)))
        return made[-1]

    for factory in (lambda: _NoInflight(HFEngine(tiny_qwen2(tok), tok)), mixed):
        pool = RolloutPool(factory, replicas=2, backend="thread")
        try:
            assert type(pool) is RolloutPool and not isinstance(pool, InflightWeightUpdate)
        finally:
            pool.close()


class _DiesOnGenerate(HFEngine):
    """A replica whose device dies on its first batch (as a CUDA error would)."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


class _DiesOnPause(HFEngine):
    """A replica whose device died between batches: the next call it gets, the pause, fails."""

    def pause_generation(self) -> None:
        raise RuntimeError("CUDA error: device-side assert triggered")


def test_a_replica_restarted_after_a_resume_comes_up_at_the_latest_version(tok: Any, encode: Any) -> None:
    made: list[str] = []

    def factory() -> HFEngine:
        kind = _DiesOnGenerate if len(made) == 1 else HFEngine  # the second replica built dies
        made.append(kind.__name__)
        return kind(tiny_qwen2(tok), tok)

    pool = RolloutPool(factory, replicas=2, backend="thread")
    try:
        pool.pause_generation()
        pool.resume_generation(5)
        got = pool.generate([_greedy(encode, f"{i}+2=", 6) for i in range(4)])  # two land on the dying replica
    finally:
        pool.close()
    assert made == ["HFEngine", "_DiesOnGenerate", "HFEngine"] and pool.restarts == 1
    assert all(g[0].policy_versions == [5] * 6 for g in got)  # the fresh replica's tokens too


def test_a_replica_restarted_during_a_pause_stays_paused_until_the_resume(tok: Any, encode: Any) -> None:
    made: list[str] = []
    fresh: list[HFEngine] = []

    def factory() -> HFEngine:
        kind = _DiesOnPause if not made else HFEngine
        made.append(kind.__name__)
        fresh.append(kind(tiny_qwen2(tok), tok, HFEngineConfig(gather_s=0.0)))
        return fresh[-1]

    pool = RolloutPool(factory, replicas=1, backend="thread")
    results: dict[str, list[Completion]] = {}
    try:
        assert isinstance(pool, InflightWeightUpdate)  # _DiesOnPause has the capability until it is used
        pool.pause_generation()  # the replica dies here and is rebuilt, paused
        assert made == ["_DiesOnPause", "HFEngine"] and pool.restarts == 1
        caller = _in_thread(pool, _greedy(encode, "3+3=", 5), results, "late")
        time.sleep(0.5)
        assert not results and fresh[-1].decode_stats.steps == 0  # the rebuilt replica waits for the resume
        pool.resume_generation(9)
        caller.join(120)
    finally:
        pool.close()
    assert results["late"][0].policy_versions == [9] * 5


@pytest.mark.ray
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (extra `ray`)")
def test_ray_replicas_pause_and_resume_with_their_generation_slots_full(tok: Any, encode: Any) -> None:
    """Ray actor replicas: more requests than an actor has generation slots wait in a paused engine, and the
    pool's push and resume still reach them (their own concurrency group)."""
    import ray

    from rlloom.core_rl.distributed.ray_start import start_ray

    start_ray(None, num_cpus=2, include_dashboard=False, log_to_driver=False)  # one retry on a busy machine
    try:
        pool = RolloutPool(
            lambda: HFEngine(tiny_qwen2(tok), tok, HFEngineConfig(gather_s=0.0)),
            replicas=2,
            call_timeout_s=120,
            ray_actor_options={"num_cpus": 0.5, "max_concurrency": 2},
        )
        assert pool.backend == "ray" and isinstance(pool, InflightWeightUpdate)
        pool.pause_generation()

        async def during_pause() -> list[list[Completion]]:
            return await asyncio.gather(*(pool.agenerate(_greedy(encode, f"{i}+4=", 4)) for i in range(6)))

        results: dict[str, list[list[Completion]]] = {}
        caller = threading.Thread(target=lambda: results.update({"all": asyncio.run(during_pause())}))
        caller.start()
        time.sleep(1.0)
        assert not results  # three requests per actor, two slots each: all wait for the resume
        norm = tiny_qwen2(tok).get_parameter("model.norm.weight")
        pool.update_weights({"model.norm.weight": torch.full_like(norm, 2.0)})
        pool.resume_generation(3)
        caller.join(120)
        pool.close()
    finally:
        ray.shutdown()
    assert [c[0].policy_versions for c in results["all"]] == [[3] * 4] * 6
