"""rlloom.agent: multi-turn agent loop, environments, parsers, tools and loss masks."""

from rlloom.agent.__about__ import __version__

__all__ = ["__version__"]
