"""rlloom.rollout: generation engines (HF transformers, vLLM, OpenAI-compatible HTTP), sampling, weight sync and an OpenAI-compatible server."""

from rlloom.rollout.__about__ import __version__

__all__ = ["__version__"]
