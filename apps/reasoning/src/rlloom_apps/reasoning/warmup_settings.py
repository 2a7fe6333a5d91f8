"""`reasoning warmup`'s settings, in a module that imports no torch: the CLI builds its flags (and `--help`) from
these fields' defaults and descriptions, and checks them before the model loads. The supervised step's settings
(--lr, --batch-size, --max-tokens-per-micro-batch, --gradient-checkpointing, --max-rows, --seed) are core-rl's,
shared with `search-agent warmup`; this app adds how long to train, in passes over the rows."""

from __future__ import annotations

import math

from pydantic import Field

from rlloom.core_rl.workers import WarmupSettingsBase


class WarmupSettings(WarmupSettingsBase):
    """How long and how fast the warm-up trains; the defaults suit a small pretrained instruct model (SmolLM2-135M)."""

    epochs: float = Field(default=2.0, gt=0, description="Passes over the demonstrations (fractions allowed).")

    def steps(self, demonstrations: int) -> int:
        """AdamW steps for `epochs` passes over `demonstrations` in batches of `batch_size` (at least one)."""
        return max(1, math.ceil(self.epochs * demonstrations / self.batch_size))
