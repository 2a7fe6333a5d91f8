"""The proxy over rank replicas (`RankEngines`) implements exactly the capabilities its replicas report: with
replicas that sleep and label their syncs (vLLM's), the trainer's calls reach every replica; with replicas that
cannot, the proxy has no such methods, so `isinstance` says so, as it would of the engine itself.

Each "rank" here is the real `RankEngineHost` in this process, reached through `LocalRanks`, which calls every
host as `RayActorGroup.call` calls every rank process; generation over Ray ranks is test_distributed_rollout's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_engine_sleep import SleepyEngine
from tiny_run import SamplingEngine

from rlloom.core_rl.contracts.engines import (
    Closable,
    HasContextWindow,
    HasEosTokens,
    RolloutEngine,
    SleepMode,
    WeightSyncLifecycle,
)
from rlloom.core_rl.distributed.rank_engines import RankEngineHost, RankEngines, rank_engines

pytest.importorskip("ray")  # RankEngines holds Ray's module for its generation calls


class CountingSleepyEngine(SleepyEngine):
    """vLLM's whole surface: sleep mode, the sync lifecycle and a count of finished syncs."""

    def __init__(self, model_dir: str | Path) -> None:
        super().__init__(model_dir)
        self.weight_syncs = 0

    def finish_weight_sync(self) -> None:
        super().finish_weight_sync()
        self.weight_syncs += 1


class LocalRanks:
    """`RayActorGroup`'s calls to every rank, in this process: one `RankEngineHost` per rank, in rank order."""

    timeout_s = 30.0

    def __init__(self, hosts: list[RankEngineHost]) -> None:
        self.ranks = hosts

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        assert role == "engine"
        return [getattr(host, method)(*args, **kwargs) for host in self.ranks]


@pytest.fixture
def hosts() -> Iterator[Callable[[RolloutEngine], RankEngineHost]]:
    """Makes a rank's host around an engine (no actor: these tests push no weights); closes them all after."""
    made: list[RankEngineHost] = []

    def host(engine: RolloutEngine) -> RankEngineHost:
        made.append(RankEngineHost(engine, actor=None))  # type: ignore[arg-type]
        return made[-1]

    yield host
    for h in made:
        h.close()


def _proxy(*hosts: RankEngineHost) -> RankEngines:
    return rank_engines(LocalRanks(list(hosts)), [h.describe() for h in hosts])  # type: ignore[arg-type]


def test_replicas_with_sleep_mode_and_sync_labels_get_them_through_the_proxy(hosts: Any, tiny_model_dir: Path) -> None:
    engines = [CountingSleepyEngine(tiny_model_dir), CountingSleepyEngine(tiny_model_dir)]
    proxy = _proxy(*(hosts(e) for e in engines))
    assert isinstance(proxy, RankEngines) and isinstance(proxy, RolloutEngine)
    assert isinstance(proxy, SleepMode) and isinstance(proxy, WeightSyncLifecycle)
    assert isinstance(proxy, HasContextWindow) and isinstance(proxy, HasEosTokens) and isinstance(proxy, Closable)
    # EngineWeights' order around a sync, each call reaching every replica
    proxy.sleep(level=1)
    proxy.wake_up(tags=["weights"])
    proxy.begin_weight_sync(4)
    proxy.finish_weight_sync()
    proxy.wake_up(tags=["kv_cache"])
    for engine in engines:
        assert engine.events == ["sleep(1)", "wake_up(weights)", "begin(4)", "finish", "wake_up(kv_cache)"]
        assert not engine.asleep
    # each replica's report counts its finished syncs
    assert [info["weight_syncs"] for info in proxy.replica_info()] == [1, 1]


def test_replicas_without_them_make_a_proxy_without_them(hosts: Any, tiny_model_dir: Path) -> None:
    proxy = _proxy(hosts(SamplingEngine(tiny_model_dir)), hosts(SamplingEngine(tiny_model_dir)))
    assert isinstance(proxy, RolloutEngine)
    assert not isinstance(proxy, SleepMode) and not isinstance(proxy, WeightSyncLifecycle)
    assert [info["weight_syncs"] for info in proxy.replica_info()] == [None, None]  # nothing counts them
    # a capability only some replicas have is not forwarded: the others could not honour it
    sleepy = SleepyEngine(tiny_model_dir)
    mixed = _proxy(hosts(sleepy), hosts(SamplingEngine(tiny_model_dir)))
    assert not isinstance(mixed, SleepMode) and not isinstance(mixed, WeightSyncLifecycle)
    assert sleepy.events == []
