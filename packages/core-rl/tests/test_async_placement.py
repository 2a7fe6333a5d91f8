"""Where the rollout engines run under `trainer.mode=async` (issue 42), without a Ray cluster: the proxy over
replicas forwards in-flight weight updates exactly when every replica has them (pause reaches every replica, the
tokens after the resume carry the new version), and the separate placement's keys and refusals name the key.

Each replica here is the real `RankEngineHost` around a real `HFEngine`, reached through `LocalRanks`, which calls
every host as `RayActorGroup.call` calls every actor; test_async_placement_ray runs the generators on Ray actors.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config

from rlloom.core_rl.config.schema import ConfigError
from rlloom.core_rl.contracts.engines import InflightWeightUpdate, RolloutEngine
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.weight_sync import RankLoadedEngine

pytest.importorskip("ray")  # the proxies hold Ray's module for their generation calls
hf = pytest.importorskip("rlloom.rollout.hf.engine")

from rlloom.core_rl.distributed.generators import GeneratorEngines, check_generator_resources  # noqa: E402
from rlloom.core_rl.distributed.rank_engines import RankEngineHost, RankEngines, rank_engines  # noqa: E402
from rlloom.core_rl.distributed.replica_engines import replica_proxy  # noqa: E402

MAX_TOKENS = 200


class LocalRanks:
    """`RayActorGroup`'s calls to every actor, in this process: one `RankEngineHost` per replica, in order."""

    timeout_s = 60.0

    def __init__(self, hosts: list[RankEngineHost]) -> None:
        self.ranks = hosts

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        assert role == "engine"
        return [getattr(host, method)(*args, **kwargs) for host in self.ranks]


@pytest.fixture
def hosts() -> Iterator[Any]:
    """Makes a replica's host around an engine; closes them all after."""
    made: list[RankEngineHost] = []

    def host(engine: RolloutEngine) -> RankEngineHost:
        made.append(RankEngineHost(engine, actor=None))
        return made[-1]

    yield host
    for h in made:
        h.close()


def _hf(model_dir: Path) -> Any:
    return hf.HFEngine.from_pretrained(str(model_dir), config=hf.HFEngineConfig(gather_s=0.0))


def _wait_for(condition: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_replicas_that_update_in_flight_pause_and_resume_together(hosts: Any, tiny_model_dir: Path) -> None:
    engines = [_hf(tiny_model_dir), _hf(tiny_model_dir)]
    replicas = [hosts(e) for e in engines]
    proxy = rank_engines(LocalRanks(replicas), [h.describe() for h in replicas])  # type: ignore[arg-type]
    assert isinstance(proxy, RankEngines) and isinstance(proxy, InflightWeightUpdate) and proxy.keeps_kv_cache
    sampling = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    request = GenerationRequest(prompt_ids=engines[0].tokenizer.encode("1+2="), sampling=sampling)
    results: dict[int, list[Completion]] = {}
    callers = [threading.Thread(target=lambda i=i: results.update({i: replicas[i].agenerate(request)})) for i in (0, 1)]
    for caller in callers:
        caller.start()
    _wait_for(lambda: min(e.decode_stats.steps for e in engines) >= 3)
    proxy.pause_generation()  # returns once both replicas parked their request
    parked = [e.decode_stats.steps for e in engines]
    time.sleep(0.3)
    assert [e.decode_stats.steps for e in engines] == parked and not results  # neither decodes while paused
    norm = engines[0].model.get_parameter("model.norm.weight")
    proxy.group.call("engine", "update_weights", {"model.norm.weight": torch.full_like(norm, 2.0)})
    proxy.resume_generation(7)
    for caller in callers:
        caller.join(120)
    for i, engine in enumerate(engines):
        [completion] = results[i]
        versions = completion.policy_versions
        assert versions is not None and len(versions) == MAX_TOKENS
        k = versions.index(7)  # the first token sampled after the resume
        assert k >= 3  # the tokens sampled before the pause kept version 0
        assert versions == [0] * k + [7] * (MAX_TOKENS - k)
        assert torch.equal(engine.model.get_parameter("model.norm.weight"), torch.full_like(norm, 2.0))


def test_replicas_without_it_make_a_proxy_without_it(hosts: Any, tiny_model_dir: Path) -> None:
    plain_hosts = [hosts(SamplingEngine(tiny_model_dir)), hosts(SamplingEngine(tiny_model_dir))]
    plain = rank_engines(LocalRanks(plain_hosts), [h.describe() for h in plain_hosts])  # type: ignore[arg-type]
    assert not isinstance(plain, InflightWeightUpdate)
    # one replica that cannot pause is enough: the trainer must fall back to waiting for its requests
    mixed_hosts = [hosts(_hf(tiny_model_dir)), hosts(SamplingEngine(tiny_model_dir))]
    mixed = rank_engines(LocalRanks(mixed_hosts), [h.describe() for h in mixed_hosts])  # type: ignore[arg-type]
    assert not isinstance(mixed, InflightWeightUpdate) and not hasattr(mixed, "pause_generation")


def test_generator_replicas_are_sent_weights_not_loaded_from_ranks(hosts: Any, tiny_model_dir: Path) -> None:
    """The separate placement's proxy has no `sync_from_ranks`: the sync gathers the policy and pushes it."""
    replicas = [hosts(_hf(tiny_model_dir))]
    proxy = replica_proxy(GeneratorEngines, LocalRanks(replicas), [h.describe() for h in replicas])  # type: ignore[arg-type]
    assert isinstance(proxy, InflightWeightUpdate) and not isinstance(proxy, RankLoadedEngine)
    assert isinstance(rank_engines(LocalRanks(replicas), [replicas[0].describe()]), RankLoadedEngine)  # type: ignore[arg-type]


def test_generator_resources_are_checked_before_anything_starts() -> None:
    check_generator_resources({"CPU": 2.0}, 2, 1.0, 0.0)  # exactly what is free
    with pytest.raises(ValueError, match=r"rollout_replicas=3 x distributed.rollout_cpus_per_replica=1 needs 3 CPUs"):
        check_generator_resources({"CPU": 2.0}, 3, 1.0, 0.0)
    with pytest.raises(ValueError, match=r"rollout_gpus_per_replica=0.5 needs 1 GPUs but the Ray cluster has 0 free"):
        check_generator_resources({"CPU": 8.0}, 2, 1.0, 0.5)


def test_separate_placement_keys_and_refusals_name_the_key(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"distributed.rollout_replicas.*rollout_placement=separate"):
        tiny_config(tiny_model_dir, tmp_path, ["distributed.rollout_replicas=2"])
    with pytest.raises(ConfigError, match=r"distributed.rollout_cpus_per_replica"):
        tiny_config(tiny_model_dir, tmp_path, ["distributed.rollout_cpus_per_replica=2"])
    cfg = tiny_config(tiny_model_dir, tmp_path, ["distributed.rollout_placement=separate"])
    with pytest.raises(ConfigError, match=r"rollout_placement=separate .* engine= is a ready SamplingEngine"):
        Trainer(cfg, engine=SamplingEngine(tiny_model_dir), reward_fn=digit_reward, train_data=sum_rows(4))
