"""The FSDP2 options of the `distributed` section: CPU offload (for good, or between phases) and hybrid sharding
(their own module, so the distributed section stays small; `DistributedConfig` inherits these fields)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from rlloom.core_rl.config.keys import KeyedValueError
from rlloom.core_rl.config.section import Section


class FsdpOptions(Section):
    cpu_offload: bool = Field(
        default=False,
        description="FSDP2's CPUOffloadPolicy on every rank: sharded parameters, their gradients and AdamW state live "
        "in CPU memory and the optimizer steps there; each layer is copied to the GPU only to compute (veRL's "
        "fsdp_config.offload_policy). Saves the GPU the trained state (16 bytes a parameter with fp32 AdamW) for "
        "host-device copies every forward and backward and a CPU optimizer step. Needs num_ranks > 1.",
    )
    param_offload: bool = Field(
        default=False,
        description="Between phases (veRL's fsdp_config.param_offload): each rank's parameter shards of the actor, "
        "reference and critic move to CPU memory after the calls that use them (update, log-probs, weight sync) and "
        "come back to the GPU at the start of the next one, so the rollout engine has that memory while it "
        "generates. Costs two host-device copies of the shards per call; unlike cpu_offload, forwards and the "
        "optimizer step run on the GPU at full speed. Needs num_ranks > 1; not with cpu_offload.",
    )
    optimizer_offload: bool = Field(
        default=False,
        description="Between phases (veRL's fsdp_config.optimizer_offload): each rank's AdamW moments of the actor "
        "and critic (8 bytes a parameter, sharded) move to CPU memory after every update and checkpoint and come "
        "back to the GPU for the next one, so they are away during generation and log-probs. Needs num_ranks > 1; "
        "not with cpu_offload.",
    )
    shard_size: int | None = Field(
        default=None,
        ge=1,
        description="Ranks in each FSDP shard group (veRL's fsdp_config.fsdp_size); None = all ranks. Smaller "
        "values shard within a group and replicate across groups (hybrid sharding, HSDP): set the GPUs of one node "
        "so parameter all-gathers stay on the node's fast links and only the gradient all-reduce crosses nodes. "
        "Must divide num_ranks; 1 = plain data parallelism (every rank holds everything).",
    )

    @model_validator(mode="after")
    def _check_fsdp(self) -> Any:
        ranks = int(getattr(self, "num_ranks", 1))
        if ranks == 1 and (self.cpu_offload or self.shard_size not in (None, 1)):
            key = "distributed.cpu_offload" if self.cpu_offload else "distributed.shard_size"
            raise KeyedValueError(key, "set, but num_ranks is 1: in-process training does not use FSDP2; set "
                                  "distributed.num_ranks > 1 (one rank per GPU) or leave it unset")  # fmt: skip
        phase = [key for key in ("param_offload", "optimizer_offload") if getattr(self, key)]
        if phase and ranks == 1:
            raise KeyedValueError(f"distributed.{phase[0]}", "set, but num_ranks is 1: it moves FSDP2 shards, and "
                                  "in-process training does not shard; set distributed.num_ranks > 1 or leave it "
                                  "unset")  # fmt: skip
        if phase and self.cpu_offload:
            raise KeyedValueError(f"distributed.{phase[0]}", "set together with distributed.cpu_offload, which keeps "
                                  "that state in CPU memory for good; keep one of them")  # fmt: skip
        if self.shard_size is not None and ranks % self.shard_size:
            raise KeyedValueError(
                "distributed.shard_size",
                f"{self.shard_size} does not divide distributed.num_ranks={ranks}: shard groups must all be the same "
                "size; use the GPUs per node (e.g. 8) or a divisor of num_ranks",
            )
        return self


__all__ = ["FsdpOptions"]
