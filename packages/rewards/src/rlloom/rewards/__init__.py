"""rlloom.rewards: math, QA, code-execution, format and judge scorers with a sandbox and safe batch scoring. No torch."""

from rlloom.rewards.__about__ import __version__

__all__ = ["__version__"]
