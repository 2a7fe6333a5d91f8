"""The driver's one `RolloutEngine` over engine replicas in Ray actors: the training ranks' own (`rank_engines`,
colocated) or generator actors of their own (`generators`, `distributed.rollout_placement: separate`).

Requests and agent turns go to the replica with the fewest pending tokens (`contracts.dispatch`); weights from the
driver are stored once in Ray's object store and every replica loads that copy. Each replica reports its engine's
capabilities (`contracts.engines.describe_engine`); the proxy implements exactly those of `FORWARDED` that every
replica has, so `isinstance(engines, InflightWeightUpdate)` is as true as on the engine itself, and the trainer's
fallbacks (the update gate, chunked re-prefill) still apply over replicas that lack it.

Calls that steer the replicas (pause, resume, weight loads, sleep, reports) run in a Ray concurrency group of their
own on every actor (`CONTROL_GROUP`): while the engines are paused, every generation thread of an actor may be
waiting for the resume, which must still get through.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import torch

from rlloom.core_rl.contracts.dispatch import ReplicaDispatcher, by_replica
from rlloom.core_rl.contracts.engines import InflightWeightUpdate, SleepMode, WeightSyncLifecycle
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest

ENGINE_CALLS = 64
"""Concurrent generation calls an actor serves (its Ray max_concurrency): agent turns interleave on the replica."""
CONTROL_GROUP = "engine_control"
"""The Ray concurrency group (declared on every actor hosting a replica) that the steering calls run in."""
CONTROL_CALLS = 2
"""Threads of `CONTROL_GROUP`: a steering call and a report may run at once."""
GENERATION_CALLS = frozenset({"generate", "agenerate"})
"""The host's calls that generate (the actor's default group); every other engine call steers."""

FORWARDED = {
    "sleep_mode": SleepMode,
    "weight_sync_lifecycle": WeightSyncLifecycle,
    "inflight_weight_update": InflightWeightUpdate,
}
"""The capabilities (`contracts.engines.CAPABILITIES` names) the proxy forwards to every replica at once, when
every replica has them: what `EngineWeights` calls around a sync (vLLM's sleep mode and sync labels) and what
`trainer.mode=async` calls around an in-flight push (pause, resume with the version)."""


class ReplicaGroup(Protocol):
    """Actors hosting one replica each (`RankEngineHost` as their "engine" role), e.g. `RayActorGroup`."""

    ranks: list[Any]
    """One Ray actor handle per replica, in replica order; `handle.call.remote("engine", method, ...)` runs
    `method` of its host."""
    timeout_s: float

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """`method` of `role` on every actor at once; the answers in replica order."""
        ...


def engine_method(handle: Any, method: str) -> Any:
    """An actor's remote `call` for the engine call `method`: in `CONTROL_GROUP` unless it generates."""
    return handle.call if method in GENERATION_CALLS else handle.call.options(concurrency_group=CONTROL_GROUP)


class ReplicaEngines:
    """The replicas as one `RolloutEngine` for the trainer and collectors (driver side); also `HasContextWindow`,
    `HasEosTokens` (the first replica's) and `Closable`. `generate` splits a batch over the replicas by pending
    tokens, largest requests first; `agenerate` sends a turn to the replica with the fewest pending tokens.
    Build it with `replica_proxy`, which adds the capabilities every replica has."""

    def __init__(self, group: ReplicaGroup, info: Sequence[Mapping[str, Any]]) -> None:
        import ray

        self._ray = ray
        self.group = group
        self.info = [dict(i) for i in info]
        self.size = len(info)
        self.timeout_s = group.timeout_s
        self.context_window: int | None = info[0]["context_window"]
        self.eos_token_ids: frozenset[int] | None = info[0]["eos_token_ids"]
        self.dispatch = ReplicaDispatcher(self.size)

    @property
    def pending_tokens(self) -> list[int]:
        """Tokens each replica has been handed and not yet answered."""
        return self.dispatch.pending_tokens

    @property
    def dispatched(self) -> list[int]:
        """Requests sent to each replica so far."""
        return self.dispatch.dispatched

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Every replica with a share decodes it at once; the answers come back in request order."""
        if not requests:
            return []
        owner, costs = self.dispatch.assign(requests)
        parts = by_replica(owner)
        try:
            refs = {
                r: self.group.ranks[r].call.remote("engine", "generate", [requests[i] for i in idx])
                for r, idx in parts.items()
            }
            answers = self._ray.get(list(refs.values()), timeout=self.timeout_s)
        finally:
            for r, cost in zip(owner, costs, strict=True):
                self.dispatch.release(r, cost)
        results: list[list[Completion]] = [[] for _ in requests]
        for idx, answer in zip(parts.values(), answers, strict=True):
            for i, completions in zip(idx, answer, strict=True):
                results[i] = completions
        return results

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        replica, cost = self.dispatch.pick(request)
        try:
            ref = self.group.ranks[replica].call.remote("engine", "agenerate", request)
            answer: list[Completion] = await asyncio.wait_for(ref, timeout=self.timeout_s)
            return answer
        finally:
            self.dispatch.release(replica, cost)

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Weights from the driver (a bucket, or the whole policy) to every replica: stored once in the object
        store, every replica loads that copy."""
        shared = self._ray.put({k: v.detach().cpu() for k, v in named_tensors.items()})
        self.group.call("engine", "update_weights", shared)

    def requests_served(self) -> list[int]:
        """Requests each replica has served so far (replica order)."""
        return [int(info["requests"]) for info in self.replica_info()]

    def replica_info(self) -> list[dict[str, Any]]:
        """Each replica's `RankEngineHost.describe()` (replica order): its process, requests served, syncs done."""
        return list(self.group.call("engine", "describe"))

    def on_replicas(self, fn: Callable[[Any], Any]) -> list[Any]:
        """`fn(engine)` in every replica's process (replica order), for what the engine protocol does not cover:
        a custom engine's own metrics, a weight to check. `fn` travels pickled (cloudpickle)."""
        return list(self.group.call("engine", "inspect", fn))

    def close(self) -> None:
        """Shut every replica down (the actors stay, for their group to end)."""
        if self.group.ranks:
            self.group.call("engine", "close")


class _SleepOnEveryReplica:
    """`SleepMode` on every replica at once (vLLM's): they free their memory for the update together."""

    group: ReplicaGroup

    def sleep(self, level: int = 1) -> None:
        self.group.call("engine", "sleep", level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.group.call("engine", "wake_up", tags=tags)


class _SyncLifecycleOnEveryReplica:
    """`WeightSyncLifecycle` on every replica at once: each labels and closes its own part of the sync."""

    group: ReplicaGroup

    def begin_weight_sync(self, step: int) -> None:
        self.group.call("engine", "begin_weight_sync", step)

    def finish_weight_sync(self) -> None:
        self.group.call("engine", "finish_weight_sync")


class _InflightOnEveryReplica:
    """`InflightWeightUpdate` on every replica at once: `pause_generation` returns once every replica's requests
    stopped at a token boundary, `resume_generation(version)` labels every replica's next tokens `version`."""

    group: ReplicaGroup
    info: list[dict[str, Any]]

    def pause_generation(self) -> None:
        self.group.call("engine", "pause_generation")

    def resume_generation(self, policy_version: int) -> None:
        self.group.call("engine", "resume_generation", policy_version)

    @property
    def keeps_kv_cache(self) -> bool:
        """True only when every replica keeps its paused requests' KV cache."""
        return all(bool(i.get("keeps_kv_cache")) for i in self.info)


_MIXINS: dict[str, type] = {
    "sleep_mode": _SleepOnEveryReplica,
    "weight_sync_lifecycle": _SyncLifecycleOnEveryReplica,
    "inflight_weight_update": _InflightOnEveryReplica,
}
_CLASSES: dict[tuple[type, frozenset[str]], type] = {}

E = TypeVar("E", bound=ReplicaEngines)


def proxy_class(base: type[E], forwarded: frozenset[str]) -> type[E]:
    """`base` with the forwarding of each capability named in `forwarded` (`FORWARDED` keys), made once."""
    key = (base, forwarded)
    if key not in _CLASSES:
        names = sorted(forwarded)
        mixins = tuple(_MIXINS[name] for name in names)
        title = "".join(part.title() for name in names for part in name.split("_"))
        _CLASSES[key] = type(f"{base.__name__}With{title}", (*mixins, base), {}) if mixins else base
    made: type[E] = _CLASSES[key]
    return made


def shared_capabilities(info: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """The `FORWARDED` capabilities every replica reports."""
    return frozenset(FORWARDED).intersection(*(set(i["capabilities"]) for i in info))


def replica_proxy(base: type[E], group: ReplicaGroup, info: Sequence[Mapping[str, Any]]) -> E:
    """A `base` over the replicas `info` describes (`RankEngineHost.describe()`, replica order) that also
    implements each capability of `FORWARDED` every replica has, and no other."""
    return proxy_class(base, shared_capabilities(info))(group, info)


__all__ = [
    "CONTROL_CALLS",
    "CONTROL_GROUP",
    "ENGINE_CALLS",
    "FORWARDED",
    "GENERATION_CALLS",
    "ReplicaEngines",
    "ReplicaGroup",
    "engine_method",
    "proxy_class",
    "replica_proxy",
    "shared_capabilities",
]
