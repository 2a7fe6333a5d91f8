"""The actor, reference and critic as N FSDP2-sharded ranks in Ray actors, behind the in-process interfaces.

`RayActorGroup` is a `PolicyWorker` (`.reference` a `ReferenceWorker`, `.critic` a `CriticWorker`), so the
trainer loop does not know it is distributed. Each call ships the batch once through Ray's object store; every
rank takes its balanced share of rows, and the group puts the answers back in row order. Ranks talk over
torch.distributed (gloo on CPU, NCCL on GPUs); `ray start` on each machine plus `distributed.ray_address: auto`
spreads them over nodes (`cluster` settles paths, working folder and GPUs for that; docs/multinode.md).

Nothing waits forever: a rank that does not answer within `distributed.timeout_s`, or dies, raises an error
naming the call and the ranks, and collectives time out after the same limit.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from rlloom.core_rl.config.schema import RLConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch, scatter_rows
from rlloom.core_rl.distributed.cluster import (
    check_node,
    enter_driver_folder,
    gpus_per_rank,
    local_path,
    rank_runtime_env,
    with_absolute_paths,
)
from rlloom.core_rl.distributed.ray_start import start_ray
from rlloom.core_rl.distributed.replica_engines import CONTROL_CALLS, CONTROL_GROUP, ENGINE_CALLS, engine_method

RAY_HINT = "the distributed backend needs Ray: pip install 'rlloom-core-rl[ray]'"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as err:  # pragma: no cover - depends on the extra
        raise ImportError(RAY_HINT) from err
    return ray


class RankWorker:
    """What runs in each rank's Ray actor process: a `ShardedPolicyActor`, and optionally a `ShardedReference`
    and a `ShardedCritic`, on the same rank (colocated, as veRL's hybrid workers)."""

    def __init__(self) -> None:
        self.roles: dict[str, Any] = {}
        self.offloads: Any = None  # offload.PhaseOffloads with distributed.param_offload / optimizer_offload
        # a node started by `ray start` runs its workers in that command's folder: work from the driver's one
        enter_driver_folder()

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a free port for torch.distributed's TCP store (asked of rank 0)."""
        ray = _import_ray()
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = int(sock.getsockname()[1])
        return str(ray.util.get_node_ip_address()), port

    def setup(
        self,
        config_json: str,
        *,
        rank: int,
        world_size: int,
        master: tuple[str, int],
        total_steps: int,
        weights_path: str,
        with_reference: bool,
        critic_path: str | None,
        resume_from: str | None,
        use_gpu: bool | None = None,
    ) -> None:
        """Join the process group and build this rank's workers. `use_gpu`: whether the driver reserved a GPU for
        this rank (None: use one when this process sees one and trainer.device allows)."""
        import torch.distributed as dist

        from rlloom.core_rl.distributed.fsdp import fsdp_mesh, shard_model
        from rlloom.core_rl.distributed.ranks import (
            RankContext,
            ShardedCritic,
            ShardedPolicyActor,
            ShardedReference,
        )
        from rlloom.core_rl.workers.actor import load_causal_lm
        from rlloom.core_rl.workers.critic import ValueModel
        from rlloom.core_rl.workers.precision import fsdp_mixed_precision, model_precision
        from rlloom.core_rl.workers.settings import actor_settings, critic_settings, reference_settings

        cfg = RLConfig.model_validate_json(config_json)
        dcfg = cfg.distributed
        self._check_node(rank, cfg, weights=weights_path, critic=critic_path, resume=resume_from, use_gpu=use_gpu)
        torch.set_num_threads(max(1, int(dcfg.cpus_per_rank)))
        torch.manual_seed(cfg.trainer.seed)
        torch.use_deterministic_algorithms(cfg.trainer.deterministic)
        on_gpu = torch.cuda.is_available() and cfg.trainer.device != "cpu" if use_gpu is None else use_gpu
        device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")  # Ray sets CUDA_VISIBLE_DEVICES
        if on_gpu:
            torch.cuda.set_device(device)
        backend = dcfg.backend if dcfg.backend != "auto" else ("nccl" if on_gpu else "gloo")
        dist.init_process_group(
            backend,
            init_method=f"tcp://{master[0]}:{master[1]}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=dcfg.timeout_s),
        )
        ctx = RankContext(rank, world_size, device)
        resume = Path(resume_from) if resume_from is not None else None
        loaded = load_causal_lm(cfg.model, weights_path, device, resume_from=resume, seed=cfg.trainer.seed)
        # fp32 master shards, bf16 gathers and compute, fp32 gradient reduction (precision.py)
        mesh, offload = fsdp_mesh(world_size, dcfg.shard_size, device.type), dcfg.cpu_offload  # config_fsdp.py
        mixed = fsdp_mixed_precision(model_precision(cfg.model))
        actor_model = shard_model(loaded, mixed, mesh=mesh, cpu_offload=offload)
        self.roles["actor"] = ShardedPolicyActor(actor_model, ctx, **actor_settings(cfg, total_steps, device))
        if with_reference:
            # with LoRA the reference is the actor's own sharded model with the adapter disabled: no second copy;
            # else a frozen copy held in the compute dtype, which computes as the actor's bf16 gathers do
            lora = cfg.model.lora_rank > 0
            frozen = None if lora else load_causal_lm(cfg.model, cfg.model.path, device, trained=False)
            ref_model = actor_model if frozen is None else shard_model(frozen, mesh=mesh, cpu_offload=offload)
            self.roles["reference"] = ShardedReference(ref_model, ctx, **reference_settings(cfg, device))
        if critic_path is not None:
            value = ValueModel.from_pretrained(cfg.model, critic_path, device).to(device)
            value_model = shard_model(value, mesh=mesh, cpu_offload=offload)
            self.roles["critic"] = ShardedCritic(value_model, ctx, **critic_settings(cfg, total_steps, device))
        if dcfg.param_offload or dcfg.optimizer_offload:  # away until a call uses it (offload.py)
            from rlloom.core_rl.distributed.offload import PhaseOffloads

            self.offloads = PhaseOffloads(
                self.roles, parameters=dcfg.param_offload, optimizer=dcfg.optimizer_offload, device=device
            )
            self.offloads.offload_all()

    @staticmethod
    def _check_node(
        rank: int, cfg: RLConfig, *, weights: str, critic: str | None, resume: str | None, use_gpu: bool | None
    ) -> None:
        """Fail with the node and the fix, before loading, when this node lacks a path or a GPU the driver
        counted on (without the check, a missing model folder sent transformers to the model hub)."""
        ray = _import_ray()
        node = ray.util.get_node_ip_address()
        paths = {"weights": weights, "model.path": cfg.model.path, "critic": critic, "resume": resume}
        needs = "the model and the run folder"
        check_node(f"rank {rank}", node, paths, use_gpu=bool(use_gpu), needs=needs, gpu_key="distributed.gpus_per_rank")

    def start_engine(self, factory: Any, config_json: str, weights_path: str) -> dict[str, Any]:
        """Build this rank's rollout engine replica beside its shard (`rank_engines`): the "engine" role."""
        from rlloom.core_rl.distributed.rank_engines import RankEngineHost

        cfg = RLConfig.model_validate_json(config_json)
        self.roles["engine"] = host = RankEngineHost.build(factory, self.roles["actor"], cfg, weights_path)
        return host.describe()

    def _worker(self, role: str) -> Any:
        if role not in self.roles:
            raise RuntimeError(f"this worker group holds no {role} (it has {sorted(self.roles)})")
        return self.roles[role]

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run `method` of this rank's `role` worker (actor, reference, critic or engine), with the state it uses
        on the device for the call when it is offloaded between phases."""
        if role not in self.roles:
            raise RuntimeError(f"this worker group holds no {role} (it has {sorted(self.roles)})")
        with self._on_device(role, method):
            return getattr(self.roles[role], method)(*args, **kwargs)

    def _on_device(self, role: str, method: str) -> AbstractContextManager[None]:
        return nullcontext() if self.offloads is None else self.offloads.on_device(role, method)

    def hold(self, role: str) -> None:
        """Keep `role`'s parameters on the device across several calls (a bucketed weight sync) until `release`."""
        if self.offloads is not None and role in self.offloads.parameters:
            self.offloads.parameters[role].acquire()

    def release(self, role: str) -> None:
        if self.offloads is not None and role in self.offloads.parameters:
            self.offloads.parameters[role].release()

    def placement(self, role: str) -> dict[str, int]:
        """Bytes of `role`'s parameter shards and optimizer state on this rank's device now (0 while offloaded)."""
        from rlloom.core_rl.distributed.offload import placement

        return placement(self._worker(role))

    def save_shards(self, role: str, path: str) -> None:
        """This rank's shard of `role`'s weights and optimizer into the DCP folder `path` (sharded_checkpoint)."""
        from rlloom.core_rl.run.sharded_checkpoint import save_worker_shards

        with self._on_device(role, "save_shards"):
            save_worker_shards(self._worker(role), path, with_config=role == "actor")

    def shard_state(self, role: str) -> dict[str, Any]:
        from rlloom.core_rl.run.sharded_checkpoint import shard_state

        with self._on_device(role, "shard_state"):
            return shard_state(self._worker(role), role)

    def load_state(self, role: str, state: Mapping[str, Any]) -> None:
        """`role`'s entry of a checkpoint: DCP shards (any number of ranks wrote them) or a full-size state."""
        from rlloom.core_rl.run.sharded_checkpoint import SHARDS_KEY, load_worker_shards

        if SHARDS_KEY in state:
            with self._on_device(role, "load_state"):
                load_worker_shards(self._worker(role), state)
        else:
            self.call(role, "load_state_dict", state)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RayActorGroup:
    """`PolicyWorker` over `distributed.num_ranks` FSDP2 ranks (see the module docstring).

    weights_path: where the ranks load the policy from (`model.path`, or a checkpoint when resuming).
    resume_from: the checkpoint being resumed, whose `adapter/` a LoRA policy reloads.
    with_reference: also hold a sharded frozen reference (from `model.path`) on the same ranks, for KL;
        `.reference` is then its `ReferenceWorker`.
    critic_path: also hold a sharded value model initialised from there; `.critic` is then its `CriticWorker`.
    """

    def __init__(
        self,
        cfg: RLConfig,
        *,
        total_steps: int,
        weights_path: str,
        with_reference: bool,
        critic_path: str | None = None,
        resume_from: str | None = None,
    ) -> None:
        ray = _import_ray()
        self._ray = ray
        dcfg = cfg.distributed
        if not ray.is_initialized():
            start_ray(dcfg.ray_address, include_dashboard=False, log_to_driver=True)
        self.num_ranks = dcfg.num_ranks
        self.timeout_s = dcfg.timeout_s
        cluster = ray.cluster_resources()
        gpus = gpus_per_rank(dcfg.gpus_per_rank, cfg.trainer.device, cluster)
        _check_resources(cluster, self.num_ranks, dcfg.cpus_per_rank, gpus)
        # the engine's steering calls (pause, resume, weight loads) get threads of their own (replica_engines)
        remote_cls = ray.remote(concurrency_groups={CONTROL_GROUP: CONTROL_CALLS})(RankWorker)
        runtime_env = rank_runtime_env(dcfg.runtime_env)
        # an engine on the rank serves many agent turns at once (threads); training calls still come one at a time
        calls = ENGINE_CALLS if dcfg.rollout_on_ranks else 1
        options = {"num_cpus": dcfg.cpus_per_rank, "num_gpus": gpus, "runtime_env": runtime_env}
        self.ranks = [remote_cls.options(**options, max_concurrency=calls).remote() for _ in range(self.num_ranks)]
        master = self._gather([self.ranks[0].rendezvous_address.remote()], "rendezvous")[0]
        config_json = with_absolute_paths(cfg).model_dump_json()
        setups = [
            worker.setup.remote(
                config_json,
                rank=rank,
                world_size=self.num_ranks,
                master=tuple(master),
                total_steps=total_steps,
                weights_path=local_path(weights_path),
                with_reference=with_reference,
                critic_path=local_path(critic_path),
                resume_from=local_path(resume_from),
                use_gpu=gpus > 0,
            )
            for rank, worker in enumerate(self.ranks)
        ]
        self._gather(setups, "setup")
        self.reference = RayReference(self) if with_reference else None
        self.critic = RayCritic(self) if critic_path is not None else None

    # ------------------------------------------------------------------ PolicyWorker
    def compute_logprobs(
        self, batch: TrajectoryBatch, *, temperature: float, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.row_logprobs("actor", batch, temperature=temperature, entropy=entropy)

    def update_policy(
        self,
        batch: TrajectoryBatch,
        *,
        temperature: float = 1.0,
        entropy_coef: float | None = None,
        ptx_batch: Callable[[], TrajectoryBatch] | None = None,
    ) -> dict[str, float]:
        if ptx_batch is not None:  # the config refuses algorithm.ptx_coef with distributed.num_ranks > 1
            raise NotImplementedError("PPO-ptx (algorithm.ptx_coef) runs in the in-process actor only")
        ref = self._ray.put(batch)
        metrics = self.call("actor", "update_policy", ref, temperature=temperature, entropy_coef=entropy_coef)
        return dict(metrics[0])  # every rank summed the same totals

    def named_weights(self) -> Mapping[str, torch.Tensor]:
        return dict(self.call("actor", "named_weights")[0])  # gathered at rank 0

    def iter_weight_buckets(self, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        """The full weights a bucket at a time (`weight_sync.BucketedWeights`): each bucket is gathered at
        rank 0 and shipped on its own, so no process holds a second whole copy of the model."""
        self.each("hold", "actor")  # with param_offload: on the device once for all buckets, not once a bucket
        try:
            for names in self.call("actor", "weight_bucket_plan", bucket_bytes)[0]:
                yield dict(self.call("actor", "gather_weights", names)[0])
        finally:
            if self.ranks:
                self.each("release", "actor")

    def save_pretrained(self, path: str) -> None:
        self.call("actor", "save_pretrained", _absolute(path))

    def state_dict(self) -> dict[str, Any]:
        """The full-size optimizer state in the single-process layout, gathered on every rank (checkpoints use
        `save_shards` and `shard_state` instead: no rank builds the whole optimizer state)."""
        return dict(self.call("actor", "state_dict")[0])

    def save_shards(self, path: str) -> None:
        """Each rank writes its own shard of the weights and optimizer into the DCP folder `path`."""
        self.each("save_shards", "actor", _absolute(path))

    def shard_state(self) -> dict[str, Any]:
        return dict(self.each("shard_state", "actor")[0])

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """A full-size state, or `shard_state`'s entry with an absolute `shards` folder (sharded_checkpoint)."""
        self.each("load_state", "actor", self._ray.put(dict(state)))

    def start_engines(self, factory: Any, cfg: RLConfig, weights_path: str) -> list[dict[str, Any]]:
        """A rollout engine replica on every rank from `factory` (`rank_engines.start_rank_engines`)."""
        config_json = with_absolute_paths(cfg).model_dump_json()
        refs = [worker.start_engine.remote(factory, config_json, local_path(weights_path)) for worker in self.ranks]
        return self._gather(refs, "start_engine")

    # ------------------------------------------------------------------ plumbing
    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """`method` of `role` on every rank at once (they meet in collectives); the answers in rank order."""
        if not self.ranks:
            raise RuntimeError("this RayActorGroup was closed (by close(), or after a rank failed); build a new one")
        remote = (lambda worker: engine_method(worker, method)) if role == "engine" else (lambda worker: worker.call)
        refs = [remote(worker).remote(role, method, *args, **kwargs) for worker in self.ranks]
        return self._gather(refs, f"{role}.{method}")

    def each(self, method: str, role: str, *args: Any) -> list[Any]:
        """`RankWorker.method(role, ...)` on every rank at once; the answers in rank order."""
        if not self.ranks:
            raise RuntimeError("this RayActorGroup was closed (by close(), or after a rank failed); build a new one")
        refs = [getattr(worker, method).remote(role, *args) for worker in self.ranks]
        return self._gather(refs, f"{role}.{method}")

    def row_logprobs(
        self, role: str, batch: TrajectoryBatch, *, temperature: float, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each rank's rows of `role`'s log-probs, put back in batch order."""
        parts = self.call(role, "rank_logprobs", self._ray.put(batch), temperature=temperature, entropy=entropy)
        width, size = batch.response_width, batch.batch_size
        logprobs = scatter_rows([(rows, lp) for rows, lp, _ in parts if rows], size, width)
        if not entropy:
            return logprobs, None
        return logprobs, scatter_rows([(rows, ent) for rows, _, ent in parts if rows], size, width)

    def close(self) -> None:
        """Tear the process group down and end the rank processes."""
        if not self.ranks:
            return
        try:
            self._gather([worker.shutdown.remote() for worker in self.ranks], "shutdown")
        finally:
            for worker in self.ranks:
                self._ray.kill(worker)
            self.ranks = []

    def _gather(self, refs: Sequence[Any], what: str) -> list[Any]:
        """Every rank's answer, in rank order. The first failure ends the wait at once: its peers are usually
        blocked in a collective it will never join, so the group is shut down and the error raised."""
        ray = self._ray
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        pending = list(refs)
        deadline = time.monotonic() + self.timeout_s
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                late = sorted(rank_of[ref] for ref in pending)
                self._abandon()
                raise TimeoutError(
                    f"RayActorGroup {what}: rank(s) {late} gave no answer within distributed.timeout_s="
                    f"{self.timeout_s}s (stuck in a collective, or unable to get CPUs/GPUs); the group was shut down"
                )
            for ref in ready:
                try:
                    results[rank_of[ref]] = ray.get(ref)
                except Exception as err:
                    self._fail(what, rank_of[ref], err, pending, rank_of)
        return [results[rank] for rank in range(len(refs))]

    def _fail(self, what: str, rank: int, err: Exception, pending: list[Any], rank_of: Mapping[Any, int]) -> None:
        """Raise for a failed rank after shutting the group down; a dead process is named as such, even when a
        peer's collective error (connection reset) arrived first."""
        ray = self._ray
        dead = [rank] if isinstance(err, ray.exceptions.RayActorError) else []
        if pending:  # a peer that died a moment ago shows up within this grace period
            more, _ = ray.wait(pending, num_returns=len(pending), timeout=2.0)
            for ref in more:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    dead.append(rank_of[ref])
                except Exception:  # a peer's follow-on error; the first one is reported
                    pass
        self._abandon()
        if dead:
            raise RuntimeError(
                f"RayActorGroup {what}: rank process(es) {sorted(dead)} died; the group was shut down. Resume the "
                "run from its last checkpoint (any number of ranks can load it)"
            ) from err
        err.add_note(
            f"raised on rank {rank} of {self.num_ranks} in RayActorGroup {what}; the group was shut down (its other "
            "ranks were waiting in collectives). Resume from the last checkpoint."
        )
        raise err

    def _abandon(self) -> None:
        """Kill every rank process (some may be blocked in a collective) and mark the group closed."""
        for worker in self.ranks:
            self._ray.kill(worker)
        self.ranks = []


class RayReference:
    """`ReferenceWorker` view of the frozen reference held on the group's ranks."""

    def __init__(self, group: RayActorGroup) -> None:
        self.group = group

    def compute_logprobs(
        self, batch: TrajectoryBatch, *, temperature: float, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.group.row_logprobs("reference", batch, temperature=temperature, entropy=entropy)


class RayCritic:
    """`CriticWorker` view of the value model sharded over the group's ranks."""

    def __init__(self, group: RayActorGroup) -> None:
        self.group = group

    def compute_values(self, batch: TrajectoryBatch) -> torch.Tensor:
        parts = self.group.call("critic", "rank_values", self.group._ray.put(batch))
        return scatter_rows([(rows, v) for rows, v in parts if rows], batch.batch_size, batch.response_width)

    def update_critic(self, batch: TrajectoryBatch) -> dict[str, float]:
        return dict(self.group.call("critic", "update_critic", self.group._ray.put(batch))[0])

    def save_pretrained(self, path: str) -> None:
        self.group.call("critic", "save_pretrained", _absolute(path))

    def state_dict(self) -> dict[str, Any]:
        return dict(self.group.call("critic", "state_dict")[0])

    def save_shards(self, path: str) -> None:
        self.group.each("save_shards", "critic", _absolute(path))

    def shard_state(self) -> dict[str, Any]:
        return dict(self.group.each("shard_state", "critic")[0])

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.group.each("load_state", "critic", self.group._ray.put(dict(state)))


def _absolute(path: str) -> str:
    """A path the driver names, absolute: rank processes may run in another folder."""
    return str(Path(path).expanduser().absolute())


def _check_resources(available: Mapping[str, float], ranks: int, cpus: float, gpus: float) -> None:
    """Fail now, not by hanging: Ray leaves an actor it cannot place pending forever."""
    for name, per_rank, key in (("CPU", cpus, "cpus_per_rank"), ("GPU", gpus, "gpus_per_rank")):
        need = ranks * per_rank
        have = float(available.get(name, 0.0))
        if need > have + 1e-9:
            raise ValueError(
                f"distributed.num_ranks={ranks} x distributed.{key}={per_rank} needs {need:g} {name}s but the Ray "
                f"cluster has {have:g}; lower distributed.{key} (fractions are allowed) or add nodes with `ray start`"
            )


__all__ = ["RankWorker", "RayActorGroup", "RayCritic", "RayReference"]
