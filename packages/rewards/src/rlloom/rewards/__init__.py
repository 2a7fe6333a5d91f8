"""rlloom.rewards: see the package README for what it provides."""

from rlloom.rewards.__about__ import __version__

__all__ = ["__version__"]
