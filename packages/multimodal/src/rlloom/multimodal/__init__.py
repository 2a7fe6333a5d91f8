"""rlloom.multimodal: image loading and processing, VLM adapters (Qwen2/2.5-VL) and multimodal batches."""

from rlloom.multimodal.__about__ import __version__

__all__ = ["__version__"]
