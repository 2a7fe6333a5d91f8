"""The rollout engine contract: `RolloutEngine`, which every engine implements, and one Protocol per optional
capability, which an engine implements when it has it.

Callers ask `isinstance(engine, SleepMode)` (and so on) before they use a capability, so what an engine can do is
written in one place and checked by type, not probed attribute by attribute. No base class: any object with the
methods fits. A proxy over engines elsewhere (core-rl's rank replicas) implements exactly the capabilities its
replicas report (`engine_capabilities`), so the check stays true through it.

How the Trainer gets its engine (`engine=`) is here too: a ready `RolloutEngine`, or a provider that builds one,
either on the policy's module (`EngineFactory`) or with weights of its own, once per rank (`ReplicaFactory`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest

if TYPE_CHECKING:  # the contract itself loads without torch (an eval CLI closing an HTTP engine needs none)
    import torch
    from torch import nn


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates completions and accepts new policy weights: what every engine implements.

    `agenerate` is required, not a capability: every engine has it (a blocking engine wraps `generate` in a
    thread), and multi-turn agents, the rank replicas and the pool call it without a fallback."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Complete every request; the outer list follows `requests`, the inner one holds its n samples."""
        ...

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        """Complete one request without blocking the event loop (agents interleave many of these)."""
        ...

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Load new policy weights (HF parameter names); a no-op when the engine shares the actor's tensors.
        `named_tensors` may be a subset (one bucket, see `weight_sync`): load what is given, keep the rest."""
        ...


@runtime_checkable
class SleepMode(Protocol):
    """Frees accelerator memory while the actor updates (vLLM's sleep mode, as veRL and TRL colocate); the
    trainer wakes the weights before its push and the KV cache after it."""

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self, tags: list[str] | None = None) -> None: ...


@runtime_checkable
class WeightSyncLifecycle(Protocol):
    """A weight push as a session: `begin_weight_sync(step)` labels it (a failure names its training step),
    `finish_weight_sync()` closes it, so a failed push surfaces at the sync, not at the next generation."""

    def begin_weight_sync(self, step: int) -> None: ...

    def finish_weight_sync(self) -> None: ...


@runtime_checkable
class WeightSyncCount(Protocol):
    """Counts the weight syncs it completed (a replica's report shows every replica took every push)."""

    @property
    def weight_syncs(self) -> int: ...


@runtime_checkable
class InflightWeightUpdate(Protocol):
    """Takes new weights while requests are in progress (fully asynchronous RL: generation never waits for an
    update to drain). `pause_generation()` returns once every running request stopped at a token boundary (new
    ones wait); the trainer pushes weights with `update_weights`; `resume_generation(policy_version)` lets them
    continue under the new weights, every token sampled after it labelled `policy_version` in
    `Completion.policy_versions`. `keeps_kv_cache` says whether paused requests keep their KV cache (computed
    under the old weights) or re-prefill their prompt and tokens so far under the new ones."""

    def pause_generation(self) -> None: ...

    def resume_generation(self, policy_version: int) -> None: ...

    @property
    def keeps_kv_cache(self) -> bool: ...


@runtime_checkable
class HasContextWindow(Protocol):
    """Names its model's context length (None: unknown), at which agent loops cap a conversation and a server
    caps prompts, instead of sending a prompt the engine must refuse."""

    @property
    def context_window(self) -> int | None: ...


@runtime_checkable
class HasEosTokens(Protocol):
    """Names the ids that end a turn (the tokenizer's and the model's generation config's; None: unknown), by which
    agent loops tell a sampled end of turn."""

    @property
    def eos_token_ids(self) -> AbstractSet[int] | None: ...


@runtime_checkable
class HasTokenizer(Protocol):
    """Tokenizes with a tokenizer of its own, which must encode as the trainer's does (`check_engine_tokenizer`)."""

    @property
    def tokenizer(self) -> Any: ...


@runtime_checkable
class Closable(Protocol):
    """Holds something to release (a thread, a process, GPU memory): `close()` when done."""

    def close(self) -> None: ...


@runtime_checkable
class AsyncClosable(Protocol):
    """Holds a per-event-loop resource (an HTTP connection pool): `await aclose()` on the loop that used it."""

    async def aclose(self) -> None: ...


CAPABILITIES: dict[str, type] = {
    "sleep_mode": SleepMode,
    "weight_sync_lifecycle": WeightSyncLifecycle,
    "weight_sync_count": WeightSyncCount,
    "inflight_weight_update": InflightWeightUpdate,
    "context_window": HasContextWindow,
    "eos_tokens": HasEosTokens,
    "tokenizer": HasTokenizer,
    "closable": Closable,
    "async_closable": AsyncClosable,
}
"""Each optional capability by the name a remote replica reports it under."""


def engine_capabilities(engine: object) -> frozenset[str]:
    """The names (`CAPABILITIES`) of the capabilities `engine` implements, for a replica to report to its proxy."""
    return frozenset(name for name, protocol in CAPABILITIES.items() if isinstance(engine, protocol))


def describe_engine(engine: object) -> dict[str, Any]:
    """What a replica reports of its engine besides its calls: its capabilities, its context window and its EOS
    ids (None when it does not say), as plain values that travel to a proxy in another process."""
    eos = engine.eos_token_ids if isinstance(engine, HasEosTokens) else None
    return {
        "capabilities": sorted(engine_capabilities(engine)),
        "context_window": engine.context_window if isinstance(engine, HasContextWindow) else None,
        "eos_token_ids": frozenset(int(t) for t in eos) if eos is not None else None,
    }


EngineFactory: TypeAlias = Callable[["nn.Module"], RolloutEngine]
"""Builds an engine on a policy module: the actor's own (in-process: no copy, no weight transfer) or, with a
sharded actor, an untrained copy on the driver or on each rank, loaded by the weight sync every step."""


@runtime_checkable
class ReplicaFactory(Protocol):
    """Builds engines that load their own weights (e.g. rlloom.rollout's `VLLMReplicas`): rank `rank` calls
    `build_replica(rank)` and is spared the module copy an `EngineFactory` is given; the weight sync then loads the
    replica like any other."""

    def build_replica(self, rank: int) -> RolloutEngine: ...


EngineSource: TypeAlias = RolloutEngine | EngineFactory | ReplicaFactory
"""The Trainer's `engine=`: a ready engine (weights of its own, synced every step), or a provider of one."""


__all__ = [
    "CAPABILITIES",
    "AsyncClosable",
    "Closable",
    "EngineFactory",
    "EngineSource",
    "HasContextWindow",
    "HasEosTokens",
    "HasTokenizer",
    "InflightWeightUpdate",
    "ReplicaFactory",
    "RolloutEngine",
    "SleepMode",
    "WeightSyncCount",
    "WeightSyncLifecycle",
    "describe_engine",
    "engine_capabilities",
]
