"""A rollout engine on every rank: each FSDP2 rank hosts its own replica beside its shard, behind one engine.

With one engine on the driver, N-1 GPUs wait through generation, most of an RL step. Here each rank process
(`RankWorker`) builds a replica from the caller's `EngineFactory` (called with a whole, untrained copy of the
policy in the compute dtype, as the driver's engine would be), and the trainer talks to `RankEngines`, one
`RolloutEngine` over them (`replica_engines.ReplicaEngines`: each batch's requests, and each agent turn, go to the
replicas with the least pending work; the capabilities every replica has are forwarded, sleep mode, the sync
lifecycle and in-flight weight updates among them, so `isinstance(engines, SleepMode)` is as true as on the engine
itself). `RankEngineHost` is a replica's side, on a rank or on a generator actor of its own (`generators`).

The weight sync never leaves the ranks: every rank all-gathers the FSDP2 shards a bucket at a time (the
same collectives on every rank) and loads the full bucket into its own replica, so nothing passes through the
driver or Ray's object store. The factory travels to the ranks pickled (cloudpickle: lambdas and closures work;
classes must be importable there, e.g. shipped with `distributed.runtime_env`). An engine that loads its own
weights (vLLM, from `model.path`) comes from a `ReplicaFactory` instead: the rank builds it with its rank number
(e.g. for a seed of its own) and holds no module copy beside it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor

from rlloom.core_rl.contracts.engines import (
    Closable,
    EngineFactory,
    InflightWeightUpdate,
    ReplicaFactory,
    RolloutEngine,
    WeightSyncCount,
    describe_engine,
)
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.core_rl.distributed.fsdp import merge_lora_state
from rlloom.core_rl.distributed.replica_engines import (
    ENGINE_CALLS,
    FORWARDED,
    ReplicaEngines,
    ReplicaGroup,
    replica_proxy,
)

if TYPE_CHECKING:
    from rlloom.core_rl.config.schema import RLConfig
    from rlloom.core_rl.distributed.ranks import ShardedPolicyActor
    from rlloom.core_rl.distributed.ray_group import RayActorGroup


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


def build_replica(
    factory: EngineFactory | ReplicaFactory, index: int, device: torch.device, cfg: RLConfig, weights_path: str
) -> RolloutEngine:
    """Replica `index` from the Trainer's `engine=` provider, in this process: a `ReplicaFactory` builds it with
    weights of its own; an `EngineFactory` is called with an untrained copy of the policy on `device` (in the
    compute dtype, loaded at every sync). Its tokenizer must be the run's."""
    from rlloom.core_rl.workers.actor import load_causal_lm
    from rlloom.core_rl.workers.tokenizer_loading import check_engine_tokenizer, load_pretrained_tokenizer

    model = cfg.model
    if isinstance(factory, ReplicaFactory):
        engine = factory.build_replica(index)
    else:
        copy = model.model_copy(update={"lora_rank": 0})
        engine = factory(load_causal_lm(copy, weights_path, device, trained=False))
    if not isinstance(engine, RolloutEngine):
        raise TypeError(
            f"the engine= factory returned a {type(engine).__name__}, which lacks "
            "generate/agenerate/update_weights (the RolloutEngine protocol)"
        )
    source = model.tokenizer_path or model.path
    check_engine_tokenizer(engine, load_pretrained_tokenizer(source), f"model.tokenizer_path or model.path={source}")
    return engine


class RankEngineHost:
    """A replica's side (runs in a rank process as its "engine" role, or alone in a generator actor). Async
    engine calls run on an event loop of its own, so concurrent agent turns batch on the replica as they would on
    the driver. `actor` is the rank's policy shard (None on a generator actor, which loads weights it is sent)."""

    def __init__(self, engine: RolloutEngine, actor: ShardedPolicyActor | None) -> None:
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
        """This rank's replica (a `ReplicaFactory` gets the rank number), beside the rank's shard."""
        return cls(build_replica(factory, actor.ctx.rank, actor.device, cfg, weights_path), actor)

    def describe(self) -> dict[str, Any]:
        """The engine's capabilities, context window and EOS ids (`describe_engine`), requests served, weight
        syncs completed (None where the engine does not count them), whether it keeps a paused request's KV cache
        (None without in-flight updates), and the process and machine it runs in."""
        engine = self.engine
        syncs = engine.weight_syncs if isinstance(engine, WeightSyncCount) else None
        keeps = bool(engine.keeps_kv_cache) if isinstance(engine, InflightWeightUpdate) else None
        return {
            **describe_engine(engine),
            "requests": self.requests,
            "weight_syncs": syncs,
            "keeps_kv_cache": keeps,
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }

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
        actor = self.actor
        if actor is None:
            raise RuntimeError("this replica runs beside no policy shard (a generator actor): send it weights")
        plan = actor.weight_bucket_plan(bucket_bytes)
        for names in plan:
            self.engine.update_weights(gather_bucket(actor, names))
        return len(plan)

    def _capable(self, capability: str) -> Any:
        protocol = FORWARDED[capability]
        if not isinstance(self.engine, protocol):
            raise TypeError(f"this replica's {type(self.engine).__name__} lacks {protocol.__name__}")
        return self.engine

    def sleep(self, level: int = 1) -> None:
        self._capable("sleep_mode").sleep(level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._capable("sleep_mode").wake_up(tags=tags)

    def begin_weight_sync(self, step: int) -> None:
        self._capable("weight_sync_lifecycle").begin_weight_sync(step)

    def finish_weight_sync(self) -> None:
        self._capable("weight_sync_lifecycle").finish_weight_sync()

    def pause_generation(self) -> None:
        self._capable("inflight_weight_update").pause_generation()

    def resume_generation(self, policy_version: int) -> None:
        self._capable("inflight_weight_update").resume_generation(policy_version)

    def inspect(self, fn: Callable[[RolloutEngine], Any]) -> Any:
        """`fn(engine)` here (`ReplicaEngines.on_replicas`)."""
        return fn(self.engine)

    def close(self) -> None:
        """Shut the replica down (vLLM: its engine-core process) while the rank process stays, e.g. to free the
        GPU memory; ending the rank process (the group's close, Ray's shutdown) ends vLLM's processes too."""
        if isinstance(self.engine, Closable):
            self.engine.close()
        self._loop.call_soon_threadsafe(self._loop.stop)


class RankEngines(ReplicaEngines):
    """The rank replicas as one `RolloutEngine` for the trainer and collectors (`ReplicaEngines`: dispatch by pending
    tokens, capabilities forwarded), whose weight sync never leaves the ranks: `sync_from_ranks` (`weight_sync`).
    Build it with `rank_engines(group, info)`, which adds the capabilities every replica has."""

    def sync_from_ranks(self, bucket_bytes: int) -> int:
        """Every rank loads its replica from its own shards, a bucket at a time; returns the buckets per rank."""
        return int(self.group.call("engine", "load_own_shards", bucket_bytes)[0])


def rank_engines(group: ReplicaGroup, info: Sequence[Mapping[str, Any]]) -> RankEngines:
    """The proxy over the rank replicas `info` describes (`RankEngineHost.describe()`, rank order): a `RankEngines`
    that also implements each capability of `FORWARDED` every replica has, and no other."""
    return replica_proxy(RankEngines, group, info)


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
    "build_replica",
    "gather_bucket",
    "rank_engines",
    "start_rank_engines",
]
