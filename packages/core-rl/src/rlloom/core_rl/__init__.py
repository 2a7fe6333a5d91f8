"""rlloom.core_rl: batch protocol, advantage estimators, policy/value losses, KL, the trainer loop, checkpoints and metrics."""

from rlloom.core_rl.__about__ import __version__

__all__ = ["__version__"]
