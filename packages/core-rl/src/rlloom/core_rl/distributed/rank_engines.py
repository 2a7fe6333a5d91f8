"""A rollout engine on every rank: each FSDP2 rank hosts its own replica beside its shard, behind one engine.

With one engine on the driver, N-1 GPUs wait through generation, most of an RL step. Here each rank process
(`RankWorker`) builds a replica from the caller's `EngineFactory` (called with a whole, untrained copy of the
policy in the compute dtype, as the driver's engine would be), and the trainer talks to `RankEngines`, one
`RolloutEngine` that sends each batch's requests, and each agent turn, to the replicas with the least pending
work. The weight sync never leaves the ranks: every rank all-gathers the FSDP2 shards a bucket at a time (the
same collectives on every rank) and loads the full bucket into its own replica, so nothing passes through the
driver or Ray's object store. The factory travels to the ranks pickled (cloudpickle: lambdas and closures work;
classes must be importable there, e.g. shipped with `distributed.runtime_env`). An engine that loads its own
weights (vLLM, from `model.path`) comes from a `ReplicaFactory` instead: the rank builds it with its rank number
(e.g. for a seed of its own) and holds no module copy beside it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from rlloom.core_rl.contracts.dispatch import assign_by_tokens, request_tokens
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.core_rl.contracts.protocols import RolloutEngine
from rlloom.core_rl.distributed.fsdp import merge_lora_state

if TYPE_CHECKING:
    from rlloom.core_rl.config.schema import RLConfig
    from rlloom.core_rl.distributed.ranks import ShardedPolicyActor
    from rlloom.core_rl.distributed.ray_group import RayActorGroup

EngineFactory = Callable[[nn.Module], RolloutEngine]


@runtime_checkable
class ReplicaFactory(Protocol):
    """A factory whose engines load their own weights (e.g. rlloom.rollout's `VLLMReplicas`): each rank calls
    `build_replica(rank)` and is spared the module copy an `EngineFactory` is given; the weight sync then loads
    the replica from the rank's shards like any other."""

    def build_replica(self, rank: int) -> RolloutEngine: ...


ENGINE_CALLS = 64
"""Concurrent calls a rank process serves (its Ray max_concurrency): agent turns interleave on the replica."""

OPTIONAL_ENGINE_METHODS = ("sleep", "wake_up", "begin_weight_sync", "finish_weight_sync")
"""Engine methods `EngineWeights` calls when present; the proxy has them when the replicas do (vLLM sleep mode)."""


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
                f"engine_factory returned a {type(engine).__name__}, which lacks generate/agenerate/update_weights "
                "(the RolloutEngine protocol)"
            )
        source = model.tokenizer_path or model.path
        check_engine_tokenizer(
            engine, load_pretrained_tokenizer(source), f"model.tokenizer_path or model.path={source}"
        )
        return cls(engine, actor)

    def describe(self) -> dict[str, Any]:
        eos = getattr(self.engine, "eos_token_ids", None)
        return {
            "context_window": getattr(self.engine, "context_window", None),
            "eos_token_ids": frozenset(int(t) for t in eos) if eos is not None else None,
            "methods": [m for m in OPTIONAL_ENGINE_METHODS if callable(getattr(self.engine, m, None))],
            "requests": self.requests,
            "weight_syncs": getattr(self.engine, "weight_syncs", None),  # syncs completed, where the engine counts
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
        plan = self.actor.weight_bucket_plan(bucket_bytes)
        for names in plan:
            self.engine.update_weights(gather_bucket(self.actor, names))
        return len(plan)

    def engine_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """One of the engine's optional methods (`OPTIONAL_ENGINE_METHODS`)."""
        return getattr(self.engine, method)(*args, **kwargs)

    def close(self) -> None:
        """Shut the replica down (vLLM: its engine-core process) while the rank process stays, e.g. to free the
        GPU memory; ending the rank process (the group's close, Ray's shutdown) ends vLLM's processes too."""
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()
        self._loop.call_soon_threadsafe(self._loop.stop)


class RankEngines:
    """The rank replicas as one `RolloutEngine` for the trainer and collectors (driver side).

    `generate` splits a batch over the replicas by pending tokens, largest requests first; `agenerate` sends a
    turn to the replica with the fewest pending tokens. `sync_from_ranks` is the weight sync (`weight_sync`).
    """

    def __init__(self, group: RayActorGroup, info: Sequence[Mapping[str, Any]]) -> None:
        import ray

        self._ray = ray
        self.group = group
        self.size = len(info)
        self.timeout_s = group.timeout_s
        self.context_window: int | None = info[0]["context_window"]
        self.eos_token_ids: frozenset[int] | None = info[0]["eos_token_ids"]
        self.pending_tokens = [0] * self.size
        self.dispatched = [0] * self.size  # requests sent to each replica so far
        self._lock = threading.Lock()
        for method in info[0]["methods"]:  # e.g. vLLM's sleep/wake_up, then on every replica at once
            setattr(self, method, self._on_every_replica(method))

    def _on_every_replica(self, method: str) -> Callable[..., None]:
        def call(*args: Any, **kwargs: Any) -> None:
            self.group.call("engine", "engine_call", method, *args, **kwargs)

        return call

    def _take(self, owner: Sequence[int], costs: Sequence[int]) -> None:
        with self._lock:
            for r, cost in zip(owner, costs, strict=True):
                self.pending_tokens[r] += cost
                self.dispatched[r] += 1

    def _release(self, owner: Sequence[int], costs: Sequence[int]) -> None:
        with self._lock:
            for r, cost in zip(owner, costs, strict=True):
                self.pending_tokens[r] -= cost

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Every replica with a share decodes it at once; the answers come back in request order."""
        if not requests:
            return []
        costs = [request_tokens(r) for r in requests]
        with self._lock:
            owner = assign_by_tokens(costs, self.pending_tokens)
        self._take(owner, costs)
        parts: dict[int, list[int]] = {}
        for i, r in enumerate(owner):
            parts.setdefault(r, []).append(i)
        try:
            refs = {
                r: self.group.ranks[r].call.remote("engine", "generate", [requests[i] for i in idx])
                for r, idx in parts.items()
            }
            answers = self._ray.get(list(refs.values()), timeout=self.timeout_s)
        finally:
            self._release(owner, costs)
        results: list[list[Completion]] = [[] for _ in requests]
        for idx, answer in zip(parts.values(), answers, strict=True):
            for i, completions in zip(idx, answer, strict=True):
                results[i] = completions
        return results

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        cost = request_tokens(request)
        with self._lock:
            rank = min(range(self.size), key=lambda r: self.pending_tokens[r])
        self._take([rank], [cost])
        try:
            ref = self.group.ranks[rank].call.remote("engine", "agenerate", request)
            answer: list[Completion] = await asyncio.wait_for(ref, timeout=self.timeout_s)
            return answer
        finally:
            self._release([rank], [cost])

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
            f"engine_factory cannot be sent to the ranks ({err}); with distributed.rollout_on_ranks=true it is "
            "pickled to every rank process: build the engine inside it, or set distributed.rollout_on_ranks=false "
            "for one engine on the driver"
        ) from err
    return RankEngines(group, info)


__all__ = [
    "ENGINE_CALLS",
    "RankEngineHost",
    "RankEngines",
    "ReplicaFactory",
    "gather_bucket",
    "start_rank_engines",
]
