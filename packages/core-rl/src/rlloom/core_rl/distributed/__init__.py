"""Scale-out: the actor and reference as FSDP2-sharded ranks (`RayActorGroup`), interchangeable with the
in-process workers by `distributed.num_ranks` alone. Ray is an optional extra: `rlloom-core-rl[ray]`."""

from rlloom.core_rl.distributed.partition import balance_rows

__all__ = ["balance_rows"]
