"""rlloom.multimodal: image loading, pixel budgets and vision-token accounting for VLM RL."""

from rlloom.multimodal.__about__ import __version__
from rlloom.multimodal.image import VisionGrid, fit_pixel_budget, load_image, vision_grid

__all__ = ["VisionGrid", "__version__", "fit_pixel_budget", "load_image", "vision_grid"]
