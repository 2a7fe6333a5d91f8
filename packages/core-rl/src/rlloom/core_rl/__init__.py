"""rlloom.core_rl: see the package README for what it provides."""

from rlloom.core_rl.__about__ import __version__

__all__ = ["__version__"]
