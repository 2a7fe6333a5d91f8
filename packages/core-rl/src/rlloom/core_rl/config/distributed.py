"""The `distributed` section: FSDP2 ranks in Ray actors, where rollout engines live, and the limits that keep a
scaled-out run from hanging (its own module, so config.py stays small)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rlloom.core_rl.config.fsdp import FsdpOptions

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
    weight_bucket_mb: float = Field(
        default=512.0, gt=0.0, description="Weight sync to the rollout engine moves at most this much per transfer."
    )
    timeout_s: float = Field(
        default=1800.0,
        gt=0.0,
        description="Longest wait for a rank's answer or a collective before failing with an error (no hang).",
    )

    @property
    def weight_bucket_bytes(self) -> int:
        """Bytes per weight transfer to the rollout engine: weight_bucket_mb, at least 1 MiB (what vLLM's
        weight-update calls accept). Every sync (in-process, per-rank, vLLM in and out of process) reads this."""
        return max(int(self.weight_bucket_mb * 2**20), MIN_WEIGHT_BUCKET_BYTES)


__all__ = ["MIN_WEIGHT_BUCKET_BYTES", "DistributedConfig"]
