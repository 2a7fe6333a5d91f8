"""The `vision:` section of a VLM training config, and loading a config that has one.

A config file holds core-rl's `RLConfig` sections (model, data, rollout, algorithm, actor, trainer) plus `vision:`,
the image budget and prompt limit the collector needs. Overrides use the same dotted form for both
(`vision.max_pixels=12544`, `actor.lr=1e-6`). Patch, merge and temporal sizes are not settings: they are read
from the model's own `vision_config`, so the token accounting can never disagree with the ViT.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:  # imported where used: `vlm-geo3k --help` reads VisionSettings' defaults without torch
    from rlloom.core_rl.config import RLConfig
    from rlloom.multimodal import QwenVLProcessing


class VisionSettings(BaseModel):
    """EasyR1's defaults (examples/config.yaml): 512^2 .. 2048^2 pixels per image, 2048-token prompts."""

    model_config = ConfigDict(extra="forbid")

    min_pixels: int = Field(default=512 * 512, gt=0, description="Images are scaled up to at least this many pixels.")
    max_pixels: int = Field(
        default=2048 * 2048, gt=0, description="Images are scaled down to at most this many pixels (fewer tokens)."
    )
    max_prompt_tokens: int | None = Field(
        default=2048,
        gt=0,
        description="Prompt tokens after image expansion at most; longer rows are dropped before training "
        "(EasyR1's filter_overlong_prompts), never truncated. null = no limit.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> VisionSettings:
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"min_pixels={self.min_pixels} exceeds max_pixels={self.max_pixels}; lower both together "
                "(e.g. vision.min_pixels=3136 vision.max_pixels=12544)"
            )
        return self

    def processing(self, vision_config: Any, chat_template_kwargs: dict[str, Any] | None = None) -> QwenVLProcessing:
        """`QwenVLProcessing` with this budget, the model's patch, merge and temporal patch sizes, and the chat
        template variables prompts are rendered with (`data.apply_chat_template_kwargs`)."""
        from rlloom.multimodal import QwenVLProcessing

        return QwenVLProcessing(
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            max_prompt_tokens=self.max_prompt_tokens,
            patch_size=int(getattr(vision_config, "patch_size", 14)),
            merge_size=int(getattr(vision_config, "spatial_merge_size", 2)),
            temporal_patch_size=int(getattr(vision_config, "temporal_patch_size", 2)),
            chat_template_kwargs=dict(chat_template_kwargs or {}),
        )


def load_train_config(path: str | Path, overrides: Sequence[str] = ()) -> tuple[RLConfig, VisionSettings]:
    """Read the YAML, apply `key=value` overrides (values parsed as YAML), validate both parts."""
    from rlloom.core_rl.config import load_config_with_section

    return load_config_with_section(path, "vision", VisionSettings, overrides)
