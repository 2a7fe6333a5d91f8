"""The two kinds of replica a `RolloutPool` drives: an engine in this process, or one in a Ray actor.

Both expose the same calls, so the pool's dispatch and restart logic is written once. Ray is imported only when
a Ray replica is made; every blocking Ray call carries a timeout, because an actor that cannot get its resources
stays pending forever rather than failing. A Ray replica's steering calls (weights, pause, resume, reports) run
in a concurrency group of their own (`CONTROL_GROUP`): while its engine is paused, every generation slot of the
actor may hold a request waiting for the resume, which must still get through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

import torch

from rlloom.core_rl.contracts.engines import Closable, InflightWeightUpdate, RolloutEngine, describe_engine
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest

CONTROL_GROUP = "control"
"""The Ray concurrency group of a replica actor's steering calls."""


def ray_is_initialized() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return bool(ray.is_initialized())


def describe_replica(engine: RolloutEngine) -> dict[str, Any]:
    """`describe_engine`, and whether the engine keeps a paused request's KV cache (None without in-flight
    updates)."""
    keeps = bool(engine.keeps_kv_cache) if isinstance(engine, InflightWeightUpdate) else None
    return {**describe_engine(engine), "keeps_kv_cache": keeps}


def _inflight(engine: RolloutEngine) -> InflightWeightUpdate:
    if not isinstance(engine, InflightWeightUpdate):
        raise TypeError(f"this replica's {type(engine).__name__} cannot pause (no InflightWeightUpdate)")
    return engine


class Replica(Protocol):
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]: ...

    async def agenerate(self, request: GenerationRequest) -> list[Completion]: ...

    def update_weights(self, named_tensors: Any) -> None: ...

    def pause_generation(self) -> None: ...

    def resume_generation(self, policy_version: int) -> None: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class LocalReplica:
    """An engine living in this process; the pool calls it from its dispatcher threads."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        return self.engine.generate(requests)

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        return await self.engine.agenerate(request)

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        self.engine.update_weights(named_tensors)

    def pause_generation(self) -> None:
        _inflight(self.engine).pause_generation()

    def resume_generation(self, policy_version: int) -> None:
        _inflight(self.engine).resume_generation(policy_version)

    def describe(self) -> dict[str, Any]:
        return describe_replica(self.engine)

    def close(self) -> None:
        if isinstance(self.engine, Closable):
            self.engine.close()


class _EngineActorBody:
    """What runs inside the Ray actor: builds its engine from the factory and forwards calls to it."""

    def __init__(self, factory: Callable[[], RolloutEngine]) -> None:
        self.engine = factory()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        return self.engine.generate(requests)

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        return await self.engine.agenerate(request)

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        self.engine.update_weights(named_tensors)

    def pause_generation(self) -> None:
        _inflight(self.engine).pause_generation()

    def resume_generation(self, policy_version: int) -> None:
        _inflight(self.engine).resume_generation(policy_version)

    def describe(self) -> dict[str, Any]:
        return describe_replica(self.engine)

    def ready(self) -> bool:
        return True


class RayReplica:
    """An engine inside a Ray actor (placed by `ray_actor_options`, e.g. {"num_gpus": 1})."""

    def __init__(self, factory: Callable[[], RolloutEngine], options: Mapping[str, Any], timeout_s: float) -> None:
        import ray

        self._ray = ray
        self._timeout = timeout_s
        actor_cls = cast(Any, ray.remote)(concurrency_groups={CONTROL_GROUP: 2})(_EngineActorBody)
        opts = {"num_cpus": 0.5, "max_concurrency": 64, **options}
        # a Ray actor handle; Ray's stubs type its methods as the body's, without `.remote`
        self.actor = cast(Any, actor_cls.options(**opts).remote(factory))
        try:
            ray.get(self.actor.ready.remote(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(self.actor, no_restart=True)
            asked = {k: v for k, v in opts.items() if k in ("num_cpus", "num_gpus", "resources", "memory")}
            raise TimeoutError(
                f"a Ray rollout replica did not start within {timeout_s:g} s (RolloutPool call_timeout_s): it asks "
                f"for {asked} and the cluster has {ray.available_resources()} free of {ray.cluster_resources()}; "
                "lower ray_actor_options, use fewer replicas or add nodes (an actor whose resources never free up "
                "stays pending instead of failing)"
            ) from None

    @staticmethod
    def put(named_tensors: Mapping[str, torch.Tensor]) -> Any:
        """Store the weights once in Ray's object store; every replica reads the same copy."""
        import ray

        return ray.put({k: v.detach().to("cpu") for k, v in named_tensors.items()})

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        return self._ray.get(self.actor.generate.remote(list(requests)), timeout=self._timeout)

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        import asyncio

        return await asyncio.wait_for(self.actor.agenerate.remote(request), timeout=self._timeout)

    def _steer(self, method: str, *args: Any) -> Any:
        """`method` of the actor in its steering group, answered within the pool's call timeout."""
        call = getattr(self.actor, method).options(concurrency_group=CONTROL_GROUP)
        return self._ray.get(call.remote(*args), timeout=self._timeout)

    def update_weights(self, named_tensors: Any) -> None:
        ref = named_tensors if isinstance(named_tensors, self._ray.ObjectRef) else self.put(named_tensors)
        self._steer("update_weights", ref)

    def pause_generation(self) -> None:
        self._steer("pause_generation")

    def resume_generation(self, policy_version: int) -> None:
        self._steer("resume_generation", policy_version)

    def describe(self) -> dict[str, Any]:
        result: dict[str, Any] = self._steer("describe")
        return result

    def close(self) -> None:
        self._ray.kill(self.actor, no_restart=True)
