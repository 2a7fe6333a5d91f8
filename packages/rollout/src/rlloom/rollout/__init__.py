"""rlloom.rollout: see the package README for what it provides."""

from rlloom.rollout.__about__ import __version__

__all__ = ["__version__"]
