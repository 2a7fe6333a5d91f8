"""Moving the policy's weights to the rollout engine after each update, in buckets of bounded size.

A sharded actor gathers full tensors a bucket at a time (`BucketedWeights`), so neither its rank 0 nor the
object store nor the engine ever holds more than one bucket beyond the model itself; an in-process actor hands
over its whole state dict (an engine sharing its module copies nothing). Engines load each bucket as it
comes: `RolloutEngine.update_weights` accepts any subset of the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol, runtime_checkable

import torch

from rlloom.core_rl.contracts.engines import RolloutEngine, SleepMode, WeightSyncLifecycle
from rlloom.core_rl.contracts.protocols import PolicyWorker


def bucket_names(sizes: Mapping[str, int], bucket_bytes: int) -> list[list[str]]:
    """Group names (in order) into buckets of at most `bucket_bytes`; a tensor larger than that goes alone."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[list[str]] = []
    current: list[str] = []
    filled = 0
    for name, nbytes in sizes.items():
        if current and filled + nbytes > bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(name)
        filled += nbytes
    if current:
        buckets.append(current)
    return buckets


@runtime_checkable
class BucketedWeights(Protocol):
    """A policy worker that can hand its weights over a bucket at a time (e.g. `RayActorGroup`)."""

    def iter_weight_buckets(self, bucket_bytes: int) -> Iterator[Mapping[str, torch.Tensor]]: ...


@runtime_checkable
class RankLoadedEngine(Protocol):
    """An engine whose replicas live on the actor's ranks (`distributed.rank_engines.RankEngines`): each rank
    loads its own replica from its own shards, so the sync is one call and no weights pass the driver."""

    def sync_from_ranks(self, bucket_bytes: int) -> int: ...


def sync_weights(actor: PolicyWorker, engine: RolloutEngine, *, bucket_bytes: int) -> int:
    """Push the actor's current weights into `engine`; returns how many update_weights calls (buckets per
    replica) it took."""
    if isinstance(engine, RankLoadedEngine):
        return engine.sync_from_ranks(bucket_bytes)
    if isinstance(actor, BucketedWeights):
        calls = 0
        for bucket in actor.iter_weight_buckets(bucket_bytes):
            engine.update_weights(bucket)
            calls += 1
        return calls
    engine.update_weights(actor.named_weights())
    return 1


class EngineWeights:
    """Which training step's weights the actor and the rollout engine hold, and the sync that brings the engine up
    to date. They differ off-policy, where the engine may take new weights only between batches: `wait_idle`
    (set by the off-policy rollouts) waits until no batch is being generated.

    Engines with more to do around a sync say so by their capabilities (`contracts.engines`): a `SleepMode`
    engine (vLLM's) frees accelerator memory while the actor updates, takes its weights back first and the KV
    cache after the push, as veRL and TRL colocate; a `WeightSyncLifecycle` engine has each push labelled with its
    step and closed, so a failed push names its step and surfaces at the sync, not at the next generation.
    """

    def __init__(self, actor: PolicyWorker, engine: RolloutEngine, *, bucket_bytes: int, step: int) -> None:
        self.actor = actor
        self.engine = engine
        self.bucket_bytes = bucket_bytes
        self.actor_step = self.engine_step = step
        self.wait_idle: Callable[[], None] = lambda: None
        # what surrounds a push (trainer.mode=async: pause/resume the engine, or wait for the requests in progress)
        self.guard: Callable[[], AbstractContextManager[None]] = nullcontext
        self.asleep = False

    def release_memory(self) -> None:
        """Before the actor's update (colocated, on-policy): an engine with sleep mode frees its memory."""
        if isinstance(self.engine, SleepMode):
            self.engine.sleep(level=1)
            self.asleep = True

    def sync(self) -> None:
        """Push the actor's weights now (the engine must be idle), waking a sleeping engine around the push."""
        with self.guard():
            self._push()

    def _push(self) -> None:
        engine = self.engine
        if self.asleep and isinstance(engine, SleepMode):  # only a SleepMode engine is ever put to sleep
            engine.wake_up(tags=["weights"])
        if isinstance(engine, WeightSyncLifecycle):
            engine.begin_weight_sync(self.actor_step)
        sync_weights(self.actor, engine, bucket_bytes=self.bucket_bytes)
        if isinstance(engine, WeightSyncLifecycle):
            engine.finish_weight_sync()
        if self.asleep and isinstance(engine, SleepMode):
            engine.wake_up(tags=["kv_cache"])
        self.asleep = False
        self.engine_step = self.actor_step

    def refresh(self) -> None:
        """Give the engine the actor's current weights if it lacks them, once no batch is being generated."""
        self.wait_idle()
        if self.engine_step != self.actor_step or self.asleep:
            self.sync()


__all__ = ["BucketedWeights", "EngineWeights", "RankLoadedEngine", "bucket_names", "sync_weights"]
