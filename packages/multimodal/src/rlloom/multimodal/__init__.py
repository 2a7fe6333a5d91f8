"""rlloom.multimodal: image loading, pixel budgets, vision-token accounting, Qwen-VL inputs and the image-prompt
collector for VLM RL with core-rl's trainer."""

from rlloom.multimodal.__about__ import __version__
from rlloom.multimodal.collection import drop_overlong_rows, row_request, split_image_markers, vision_collector
from rlloom.multimodal.image import VisionGrid, fit_pixel_budget, load_image, vision_grid
from rlloom.multimodal.qwen_vl import (
    QwenVLProcessing,
    VisionInputs,
    VisionTokenIds,
    build_vision_inputs,
    check_vision_tokens,
    continue_positions,
    expand_image_pads,
    image_token_counts,
    mrope_position_ids,
    process_images,
    with_text_row,
)

__all__ = [
    "QwenVLProcessing",
    "VisionGrid",
    "VisionInputs",
    "VisionTokenIds",
    "__version__",
    "build_vision_inputs",
    "check_vision_tokens",
    "continue_positions",
    "drop_overlong_rows",
    "expand_image_pads",
    "fit_pixel_budget",
    "image_token_counts",
    "load_image",
    "mrope_position_ids",
    "process_images",
    "row_request",
    "split_image_markers",
    "vision_collector",
    "vision_grid",
    "with_text_row",
]
