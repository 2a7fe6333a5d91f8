"""A rollout engine on every rank: each FSDP2 rank hosts its own replica beside its shard, behind one engine.

With one engine on the driver, N-1 GPUs wait through generation, most of an RL step. Here each rank process
(`RankWorker`) builds a replica from the caller's `EngineFactory` (called with a whole, untrained copy of the
policy in the compute dtype, as the driver's engine would be), and the trainer talks to `RankEngines`, one
`RolloutEngine` that sends each batch's requests, and each agent turn, to the replicas with the least pending
work (`contracts.dispatch.ReplicaDispatcher`). Each replica reports its engine's capabilities
(`contracts.engines`); the proxy implements exactly the ones it forwards (sleep mode, the sync lifecycle) when
the replicas have them, so `isinstance(engines, SleepMode)` is as true as on the engine itself.

The weight sync never leaves the ranks: every rank all-gathers the FSDP2 shards a bucket at a time (the
same collectives on every rank) and loads the full bucket into its own replica, so nothing passes through the
driver or Ray's object store. The factory travels to the ranks pickled (cloudpickle: lambdas and closures work;
classes must be importable there, e.g. shipped with `distributed.runtime_env`). An engine that loads its own
weights (vLLM, from `model.path`) comes from a `ReplicaFactory` instead: the rank builds it with its rank number
(e.g. for a seed of its own) and holds no module copy beside it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor

from rlloom.core_rl.contracts.dispatch import ReplicaDispatcher, by_replica
from rlloom.core_rl.contracts.engines import (
    Closable,
    EngineFactory,
    ReplicaFactory,
    RolloutEngine,
    SleepMode,
    WeightSyncCount,
    WeightSyncLifecycle,
    describe_engine,
)
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.core_rl.distributed.fsdp import merge_lora_state

if TYPE_CHECKING:
    from rlloom.core_rl.config.schema import RLConfig
    from rlloom.core_rl.distributed.ranks import ShardedPolicyActor
    from rlloom.core_rl.distributed.ray_group import RayActorGroup

ENGINE_CALLS = 64
"""Concurrent calls a rank process serves (its Ray max_concurrency): agent turns interleave on the replica."""

FORWARDED = {"sleep_mode": SleepMode, "weight_sync_lifecycle": WeightSyncLifecycle}
"""The capabilities (`contracts.engines.CAPABILITIES` names) `RankEngines` forwards to every replica at once, when
the replicas have them: what `EngineWeights` calls around a sync (vLLM's sleep mode and sync labels)."""


def gather_bucket(actor: ShardedPolicyActor, names: list[str]) -> dict[str, torch.Tensor]:
    """One bucket of full weights on every rank, on the rank's device (HF names; LoRA merged); every rank must
    call with the same names: each `full_tensor` is an all-gather."""
    sources = actor.lora_sources
    wanted = [part for name in names for part in sources[name]] if sources is not None else names
    state = actor.model.state_dict()
    full: dict[str, torch.Tensor] = {}
    for name in wanted:
        value = state[name]
        full[name] = (value.full_tensor() if isinstance(value, DTensor) else value).detach()
    return merge_lora_state(full, actor.lora_scalings) if actor.lora_scalings is not None else full


class RankEngineHost:
    """This rank's replica (runs in the rank process, as its "engine" role). Async engine calls run on an event
    loop of its own, so concurrent agent turns batch on the replica as they would on the driver."""

    def __init__(self, engine: RolloutEngine, actor: ShardedPolicyActor) -> None:
        self.engine = engine
        self.actor = actor
        self.requests = 0  # requests served, so a caller can see that every replica worked
        self._count = threading.Lock()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="rlloom-rank-engine", daemon=True).start()

    @classmethod
    def build(
        cls, factory: EngineFactory | ReplicaFactory, actor: ShardedPolicyActor, cfg: RLConfig, weights_path: str
    ) -> RankEngineHost:
        from rlloom.core_rl.workers.actor import load_causal_lm
        from rlloom.core_rl.workers.tokenizer_loading import check_engine_tokenizer, load_pretrained_tokenizer

        model = cfg.model
        if isinstance(factory, ReplicaFactory):
            engine = factory.build_replica(actor.ctx.rank)
        else:
            # never trained here: held in the compute dtype, loaded from this rank's shards at every sync
            copy = model.model_copy(update={"lora_rank": 0})
            engine = factory(load_causal_lm(copy, weights_path, actor.device, trained=False))
        if not isinstance(engine, RolloutEngine):
            raise TypeError(
                f"the engine= factory returned a {type(engine).__name__}, which lacks "
                "generate/agenerate/update_weights (the RolloutEngine protocol)"
            )
        source = model.tokenizer_path or model.path
        check_engine_tokenizer(
            engine, load_pretrained_tokenizer(source), f"model.tokenizer_path or model.path={source}"
        )
        return cls(engine, actor)

    def describe(self) -> dict[str, Any]:
        """The engine's capabilities, context window and EOS ids (`describe_engine`), requests served, and weight
        syncs completed (None where the engine does not count them)."""
        syncs = self.engine.weight_syncs if isinstance(self.engine, WeightSyncCount) else None
        return {**describe_engine(self.engine), "requests": self.requests, "weight_syncs": syncs}

    def _served(self, count: int) -> None:
        with self._count:
            self.requests += count

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        self._served(len(requests))
        return self.engine.generate(requests)

    def agenerate(self, request: GenerationRequest) -> list[Completion]:
        self._served(1)
        return asyncio.run_coroutine_threadsafe(self.engine.agenerate(request), self._loop).result()

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        self.engine.update_weights(named_tensors)

    def load_own_shards(self, bucket_bytes: int) -> int:
        """Gather the policy a bucket at a time and load each into this replica; returns the buckets loaded."""
        plan = self.actor.weight_bucket_plan(bucket_bytes)
        for names in plan:
            self.engine.update_weights(gather_bucket(self.actor, names))
        return len(plan)

    def _capable(self, capability: str) -> Any:
        protocol = FORWARDED[capability]
        if not isinstance(self.engine, protocol):
            raise TypeError(f"this rank's {type(self.engine).__name__} lacks {protocol.__name__}")
        return self.engine

    def sleep(self, level: int = 1) -> None:
        self._capable("sleep_mode").sleep(level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._capable("sleep_mode").wake_up(tags=tags)

    def begin_weight_sync(self, step: int) -> None:
        self._capable("weight_sync_lifecycle").begin_weight_sync(step)

    def finish_weight_sync(self) -> None:
        self._capable("weight_sync_lifecycle").finish_weight_sync()

    def close(self) -> None:
        """Shut the replica down (vLLM: its engine-core process) while the rank process stays, e.g. to free the
        GPU memory; ending the rank process (the group's close, Ray's shutdown) ends vLLM's processes too."""
        if isinstance(self.engine, Closable):
            self.engine.close()
        self._loop.call_soon_threadsafe(self._loop.stop)


class RankEngines:
    """The rank replicas as one `RolloutEngine` for the trainer and collectors (driver side); also
    `HasContextWindow`, `HasEosTokens` (the first replica's) and `Closable`.

    `generate` splits a batch over the replicas by pending tokens, largest requests first; `agenerate` sends a
    turn to the replica with the fewest pending tokens. `sync_from_ranks` is the weight sync (`weight_sync`).
    Build it with `rank_engines(group, info)`, which picks the subclass forwarding the replicas' capabilities.
    """

    def __init__(self, group: RayActorGroup, info: Sequence[Mapping[str, Any]]) -> None:
        import ray

        self._ray = ray
        self.group = group
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
        rank, cost = self.dispatch.pick(request)
        try:
            ref = self.group.ranks[rank].call.remote("engine", "agenerate", request)
            answer: list[Completion] = await asyncio.wait_for(ref, timeout=self.timeout_s)
            return answer
        finally:
            self.dispatch.release(rank, cost)

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Weights from elsewhere (not the ranks' own shards) to every replica, stored once in the object store;
        the trainer's sync uses `sync_from_ranks` instead."""
        shared = self._ray.put({k: v.detach().cpu() for k, v in named_tensors.items()})
        self.group.call("engine", "update_weights", shared)

    def sync_from_ranks(self, bucket_bytes: int) -> int:
        """Every rank loads its replica from its own shards, a bucket at a time; returns the buckets per rank."""
        return int(self.group.call("engine", "load_own_shards", bucket_bytes)[0])

    def requests_served(self) -> list[int]:
        """Requests each replica has served so far (rank order)."""
        return [int(info["requests"]) for info in self.replica_info()]

    def replica_info(self) -> list[dict[str, Any]]:
        """Each replica's `RankEngineHost.describe()` (rank order): requests served, weight syncs completed."""
        return list(self.group.call("engine", "describe"))

    def close(self) -> None:
        """Shut every replica down (the rank processes stay, for the group to close)."""
        if self.group.ranks:
            self.group.call("engine", "close")


class _SleepOnEveryReplica(RankEngines):
    """`SleepMode` on every replica at once (vLLM's): they free their memory for the update together."""

    def sleep(self, level: int = 1) -> None:
        self.group.call("engine", "sleep", level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.group.call("engine", "wake_up", tags=tags)


class _SyncLifecycleOnEveryReplica(RankEngines):
    """`WeightSyncLifecycle` on every replica at once: each labels and closes its own sync from its shards."""

    def begin_weight_sync(self, step: int) -> None:
        self.group.call("engine", "begin_weight_sync", step)

    def finish_weight_sync(self) -> None:
        self.group.call("engine", "finish_weight_sync")


class _SleepAndSyncLifecycleOnEveryReplica(_SleepOnEveryReplica, _SyncLifecycleOnEveryReplica):
    """Both, as vLLM replicas have them."""


_PROXIES: dict[frozenset[str], type[RankEngines]] = {
    frozenset(): RankEngines,
    frozenset({"sleep_mode"}): _SleepOnEveryReplica,
    frozenset({"weight_sync_lifecycle"}): _SyncLifecycleOnEveryReplica,
    frozenset({"sleep_mode", "weight_sync_lifecycle"}): _SleepAndSyncLifecycleOnEveryReplica,
}


def rank_engines(group: RayActorGroup, info: Sequence[Mapping[str, Any]]) -> RankEngines:
    """The proxy over the replicas `info` describes (`RankEngineHost.describe()`, rank order): a `RankEngines`
    that also implements each capability of `FORWARDED` every replica has, and no other."""
    shared = frozenset(FORWARDED).intersection(*(set(i["capabilities"]) for i in info))
    return _PROXIES[shared](group, info)


def start_rank_engines(
    group: RayActorGroup, factory: EngineFactory | ReplicaFactory, config: RLConfig, weights_path: str
) -> RankEngines:
    """Build a replica on every rank of `group` from `factory`; the trainer's one engine over them."""
    try:
        info = group.start_engines(factory, config, weights_path)
    except TypeError as err:
        if not any(word in str(err).lower() for word in ("pickle", "serializ")):
            raise
        raise TypeError(
            f"the engine= factory cannot be sent to the ranks ({err}); with distributed.rollout_on_ranks=true it is "
            "pickled to every rank process: build the engine inside it, or set distributed.rollout_on_ranks=false "
            "for one engine on the driver"
        ) from err
    return rank_engines(group, info)


__all__ = [
    "ENGINE_CALLS",
    "FORWARDED",
    "EngineFactory",
    "RankEngineHost",
    "RankEngines",
    "ReplicaFactory",
    "gather_bucket",
    "rank_engines",
    "start_rank_engines",
]
