"""`reasoning warmup`'s settings, in a module that imports no torch: the CLI builds its flags (and `--help`) from
these fields' defaults and descriptions, and checks them before the model loads."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field


class WarmupSettings(BaseModel):
    """How long and how fast the warm-up trains; the defaults suit a small pretrained instruct model (SmolLM2-135M)."""

    model_config = ConfigDict(extra="forbid")

    epochs: float = Field(default=2.0, gt=0, description="Passes over the demonstrations (fractions allowed).")
    lr: float = Field(
        default=1e-5, gt=0, description="AdamW learning rate (a fine-tuning rate for a pretrained model)."
    )
    batch_size: int = Field(default=8, ge=1, description="Demonstrations per step.")
    max_tokens_per_micro_batch: int = Field(
        default=1024,
        ge=1,
        description="Tokens per forward/backward: a step's rows run in micro-batches of this many tokens (the "
        "loss is the same; memory grows with it: SmolLM2-135M float32 keeps ~1.5 MB of activations per token).",
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in backward: less memory, about a third more compute."
    )
    max_rows: int | None = Field(default=None, ge=1, description="Demonstrate the first N training rows only.")
    seed: int = Field(default=0, description="Batch order seed.")

    def steps(self, demonstrations: int) -> int:
        """AdamW steps for `epochs` passes over `demonstrations` in batches of `batch_size` (at least one)."""
        return max(1, math.ceil(self.epochs * demonstrations / self.batch_size))
