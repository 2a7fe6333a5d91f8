"""The `distributed` section: FSDP2 ranks in Ray actors, where rollout engines live (colocated with training, or
on generator actors of their own), and the limits that keep a scaled-out run from hanging (its own module, so
config.py stays small)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlloom.core_rl.config.fsdp import FsdpOptions
from rlloom.core_rl.config.keys import KeyedValueError

MIN_WEIGHT_BUCKET_BYTES = 1 << 20


class DistributedConfig(FsdpOptions):  # FSDP2's offload and hybrid sharding: config_fsdp.py
    runtime_env: dict[str, Any] | None = Field(
        default=None,
        description="Extra Ray runtime_env for the rank processes (env_vars, pip, ...), merged with the driver's "
        "working folder, which ranks always get (docs/multinode.md).",
    )
    num_ranks: int = Field(
        default=1,
        ge=1,
        description="Data-parallel ranks of the actor and reference (FSDP2 shards in Ray actors); 1 = in-process.",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto", description="torch.distributed backend: auto = nccl on GPUs, gloo on CPU."
    )
    ray_address: str | None = Field(
        default=None,
        description="Ray cluster to join (`auto` after `ray start`); None starts or reuses a local Ray.",
    )
    cpus_per_rank: float = Field(default=1.0, gt=0.0, description="Ray CPUs reserved per rank (fractions allowed).")
    gpus_per_rank: float | None = Field(
        default=None, ge=0.0, description="Ray GPUs per rank; None = 1 when trainer.device is a GPU, else 0."
    )
    rollout_on_ranks: bool = Field(
        default=True,
        description="With num_ranks > 1 and the Trainer's engine= a factory, every rank builds its own rollout engine "
        "(on its GPU, beside its shard): HF on a copy of the policy, or with rollout.engine=vllm a vLLM replica "
        "(seed trainer.seed + rank, rollout.vllm's memory share of the rank's GPU); prompts and agent turns go to "
        "the replica with the least work, and each rank loads its replica's weights from its own shards. false: "
        "one engine on the driver, synced through it (needed for rollout.engine=vllm_server). An engine= given "
        "ready-made always stays on the driver.",
    )
    rollout_placement: Literal["colocated", "separate"] = Field(
        default="colocated",
        description="Where the rollout engines run. colocated: with training, on every rank (rollout_on_ranks) or "
        "on the driver. separate: on rollout_replicas Ray actors of their own, each with rollout_gpus_per_replica "
        "GPUs and rollout_cpus_per_replica CPUs apart from the ranks' (disaggregated: veRL's fully-async "
        "rollout.nnodes x n_gpus_per_node, AReaL's 'sglang:d2+fsdp:d2'); the Trainer's engine= must be a factory "
        "(each actor builds its replica: HF on a copy of the policy, vLLM from model.path), weights go to every "
        "actor from one object-store copy per bucket, and trainer.mode=async pauses and resumes them in flight. "
        "rollout_on_ranks is not read then.",
    )
    rollout_replicas: int = Field(
        default=1,
        ge=1,
        description="Generator actors with rollout_placement=separate, one engine replica each; prompts and agent "
        "turns go to the one with the least pending work.",
    )
    rollout_gpus_per_replica: float | None = Field(
        default=None,
        ge=0.0,
        description="Ray GPUs per generator actor (rollout_placement=separate); None = 1 when trainer.device is a "
        "GPU and the cluster has GPUs, else 0.",
    )
    rollout_cpus_per_replica: float = Field(
        default=1.0,
        gt=0.0,
        description="Ray CPUs per generator actor (rollout_placement=separate; fractions allowed); also its torch "
        "threads (at least 1).",
    )
    weight_bucket_mb: float = Field(
        default=512.0, gt=0.0, description="Weight sync to the rollout engine moves at most this much per transfer."
    )
    timeout_s: float = Field(
        default=1800.0,
        gt=0.0,
        description="Longest wait for a rank's answer or a collective before failing with an error (no hang).",
    )

    @model_validator(mode="after")
    def _check_placement(self) -> DistributedConfig:
        # by value, not by the keys given: the config travels to the ranks as a full dump, every key set
        sized = {
            "rollout_replicas": self.rollout_replicas != 1,
            "rollout_gpus_per_replica": self.rollout_gpus_per_replica is not None,
            "rollout_cpus_per_replica": self.rollout_cpus_per_replica != 1.0,
        }
        given = [key for key, changed in sized.items() if changed]
        if self.rollout_placement == "colocated" and given:
            raise KeyedValueError(
                f"distributed.{given[0]}",
                "sizes the generator actors of distributed.rollout_placement=separate, but rollout_placement is "
                "colocated (engines on the ranks or the driver); set distributed.rollout_placement=separate or "
                "leave it unset",
            )
        return self

    @property
    def weight_bucket_bytes(self) -> int:
        """Bytes per weight transfer to the rollout engine: weight_bucket_mb, at least 1 MiB (what vLLM's
        weight-update calls accept). Every sync (in-process, per-rank, vLLM in and out of process) reads this."""
        return max(int(self.weight_bucket_mb * 2**20), MIN_WEIGHT_BUCKET_BYTES)


__all__ = ["MIN_WEIGHT_BUCKET_BYTES", "DistributedConfig"]
