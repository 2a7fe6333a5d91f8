"""Rollout engines on Ray actors of their own (`distributed.rollout_placement: separate`): disaggregated generation.

Each generator actor builds one replica from the Trainer's `engine=` provider with resources of its own
(`rollout_gpus_per_replica`, `rollout_cpus_per_replica`), apart from the training ranks and the driver: on a
cluster, GPUs that only generate, as veRL's fully-async recipe (`rollout.nnodes` x `rollout.n_gpus_per_node`
beside `trainer.nnodes`) and AReaL's allocation mode (`sglang:d2+fsdp:d2`, the `+` splitting the pools) place
them. The driver talks to them through the proxy the rank replicas use (`replica_engines.ReplicaEngines`: dispatch
by pending tokens, capabilities forwarded). The weight sync gathers the policy once (a bucket at a time from
sharded ranks, or the in-process actor's state), stores each bucket once in Ray's object store, and every
generator loads that copy; under `trainer.mode=async` the push pauses and resumes them when their engines update
in flight (`InflightWeightUpdate`), so generation never waits for an update to drain.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch

from rlloom.core_rl.config.schema import RLConfig
from rlloom.core_rl.contracts.engines import EngineFactory, ReplicaFactory
from rlloom.core_rl.distributed.cluster import (
    check_node,
    enter_driver_folder,
    gpus_per_rank,
    local_path,
    rank_runtime_env,
    with_absolute_paths,
)
from rlloom.core_rl.distributed.rank_engines import RankEngineHost, build_replica
from rlloom.core_rl.distributed.ray_start import start_ray
from rlloom.core_rl.distributed.replica_engines import (
    CONTROL_CALLS,
    CONTROL_GROUP,
    ENGINE_CALLS,
    ReplicaEngines,
    engine_method,
    replica_proxy,
)


class GeneratorWorker:
    """What runs in a generator actor: one engine replica (its "engine" role), nothing else."""

    def __init__(self) -> None:
        self.roles: dict[str, RankEngineHost] = {}
        enter_driver_folder()  # a node started by `ray start` runs its workers in that command's folder

    def start(
        self, factory: EngineFactory | ReplicaFactory, config_json: str, weights_path: str, index: int, use_gpu: bool
    ) -> dict[str, Any]:
        """Build replica `index` on this actor's device; returns its `RankEngineHost.describe()`."""
        import ray

        cfg = RLConfig.model_validate_json(config_json)
        node = ray.util.get_node_ip_address()
        paths = {"weights": weights_path, "model.path": cfg.model.path}
        gpu_key = "distributed.rollout_gpus_per_replica"
        check_node(f"generator {index}", node, paths, use_gpu=use_gpu, needs="the model", gpu_key=gpu_key)
        torch.set_num_threads(max(1, int(cfg.distributed.rollout_cpus_per_replica)))
        torch.manual_seed(cfg.trainer.seed + index)
        device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")  # Ray sets CUDA_VISIBLE_DEVICES
        if use_gpu:
            torch.cuda.set_device(device)
        self.roles["engine"] = host = RankEngineHost(build_replica(factory, index, device, cfg, weights_path), None)
        return host.describe()

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method` of this actor's `role` (only "engine"), as `RankWorker.call` on a rank."""
        if role not in self.roles:
            raise RuntimeError(f"this generator holds no {role} (it has {sorted(self.roles)})")
        return getattr(self.roles[role], method)(*args, **kwargs)


class GeneratorGroup:
    """`distributed.rollout_replicas` generator actors (a `ReplicaGroup`): started with their resources checked
    first, every call answered within `distributed.timeout_s` or failed naming the generator."""

    def __init__(self, cfg: RLConfig) -> None:
        import ray

        self._ray = ray
        dcfg = cfg.distributed
        if not ray.is_initialized():
            start_ray(dcfg.ray_address, include_dashboard=False, log_to_driver=True)
        self.timeout_s = dcfg.timeout_s
        self.gpus = gpus_per_rank(dcfg.rollout_gpus_per_replica, cfg.trainer.device, ray.cluster_resources())
        replicas, cpus = dcfg.rollout_replicas, dcfg.rollout_cpus_per_replica
        check_generator_resources(ray.available_resources(), replicas, cpus, self.gpus)
        # Ray's stubs lack ray.remote's concurrency_groups keyword
        remote_cls = cast(Any, ray.remote)(concurrency_groups={CONTROL_GROUP: CONTROL_CALLS})(GeneratorWorker)
        options = {
            "num_cpus": dcfg.rollout_cpus_per_replica,
            "num_gpus": self.gpus,
            "runtime_env": rank_runtime_env(dcfg.runtime_env),
            "max_concurrency": ENGINE_CALLS,
        }
        self.ranks: list[Any] = [remote_cls.options(**options).remote() for _ in range(dcfg.rollout_replicas)]

    def start(self, factory: EngineFactory | ReplicaFactory, cfg: RLConfig, weights_path: str) -> list[dict[str, Any]]:
        """A replica on every generator from `factory`; their `describe()` reports, in order."""
        config_json = with_absolute_paths(cfg).model_dump_json()
        weights = local_path(weights_path) or weights_path
        refs = [
            worker.start.remote(factory, config_json, weights, index, self.gpus > 0)
            for index, worker in enumerate(self.ranks)
        ]
        return self._gather(refs, "start")

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """`method` of every generator's `role` at once; the answers in generator order."""
        if not self.ranks:
            raise RuntimeError("these generator actors were closed; build new ones")
        refs = [engine_method(worker, method).remote(role, method, *args, **kwargs) for worker in self.ranks]
        return self._gather(refs, f"{role}.{method}")

    def _gather(self, refs: Sequence[Any], what: str) -> list[Any]:
        ray = self._ray
        deadline = time.monotonic() + self.timeout_s
        answers: list[Any] = []
        for index, ref in enumerate(refs):
            try:
                answers.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(
                    f"generator {index} gave no answer to {what} within distributed.timeout_s={self.timeout_s}s "
                    f"(stuck, or waiting for its CPUs/GPUs: the cluster has {ray.available_resources()} free)"
                ) from None
            except ray.exceptions.RayActorError as err:
                raise RuntimeError(
                    f"generator actor {index} died during {what} (see its log above); the run cannot go on without it"
                ) from err
            except Exception as err:
                err.add_note(f"raised by generator {index} of {len(refs)} in {what}")
                raise
        return answers

    def close(self) -> None:
        """End the generator processes (their engines with them)."""
        for worker in self.ranks:
            self._ray.kill(worker)
        self.ranks = []


class GeneratorEngines(ReplicaEngines):
    """The generator actors' replicas as the trainer's one engine (`ReplicaEngines`); weights reach them from the
    driver (`update_weights`, one object-store copy per bucket). `close()` ends the actors too."""

    group: GeneratorGroup

    def close(self) -> None:
        if not self.group.ranks:
            return
        try:
            super().close()
        finally:
            self.group.close()


def check_generator_resources(free: Mapping[str, float], replicas: int, cpus: float, gpus: float) -> None:
    """Fail now, not by hanging: Ray leaves an actor it cannot place pending forever. `free`: what the cluster has
    left once the training ranks hold theirs."""
    for name, per_replica in (("CPU", cpus), ("GPU", gpus)):
        key = f"rollout_{name.lower()}s_per_replica"
        need, have = replicas * per_replica, float(free.get(name, 0.0))
        if need > have + 1e-9:
            raise ValueError(
                f"distributed.rollout_replicas={replicas} x distributed.{key}={per_replica:g} needs {need:g} {name}s "
                f"but the Ray cluster has {have:g} free beside the training ranks; lower distributed.{key} (fractions "
                "are allowed) or rollout_replicas, or add nodes with `ray start`"
            )


def start_generators(factory: EngineFactory | ReplicaFactory, cfg: RLConfig, weights_path: str) -> GeneratorEngines:
    """`distributed.rollout_replicas` generator actors, each building a replica from `factory`; the trainer's one
    engine over them."""
    group = GeneratorGroup(cfg)
    try:
        info = group.start(factory, cfg, weights_path)
    except TypeError as err:
        group.close()
        if not any(word in str(err).lower() for word in ("pickle", "serializ")):
            raise
        raise TypeError(
            f"the engine= factory cannot be sent to the generator actors ({err}); with distributed.rollout_placement"
            "=separate it is pickled to each of them: build the engine inside it, or set rollout_placement=colocated"
        ) from err
    except BaseException:
        group.close()
        raise
    return replica_proxy(GeneratorEngines, group, info)


__all__ = [
    "GeneratorEngines",
    "GeneratorGroup",
    "GeneratorWorker",
    "check_generator_resources",
    "start_generators",
]
