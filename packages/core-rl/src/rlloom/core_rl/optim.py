"""AdamW with warm-up + constant or cosine learning-rate schedules, and the PPO mini-batch iteration.

Schedules come from transformers (well kept, and their state is a plain LambdaLR step count, so checkpoints
restore them exactly). The scheduler steps once per training step, not per optimizer step, so `warmup_steps`
and `total_steps` mean what a user reads in the config whatever the mini-batch count.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers.optimization import (
    get_constant_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
)

from rlloom.core_rl.batch import TrajectoryBatch
from rlloom.core_rl.config import ActorConfig


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: ActorConfig, total_steps: int
) -> tuple[torch.optim.AdamW, LambdaLR]:
    """AdamW over the trainable `params` and its schedule over `total_steps` training steps."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ValueError("build_optimizer: the model has no trainable parameters (all requires_grad=False)")
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, foreach=True)
    if cfg.lr_schedule == "cosine":
        scheduler = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer,
            num_warmup_steps=cfg.warmup_steps,
            num_training_steps=max(total_steps, cfg.warmup_steps + 1),
            min_lr_rate=cfg.min_lr_ratio,
        )
    else:
        scheduler = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=cfg.warmup_steps)
    return optimizer, scheduler


def ppo_minibatches(
    batch: TrajectoryBatch, rows: int, *, epochs: int, shuffle: bool, generator: torch.Generator
) -> Iterator[TrajectoryBatch]:
    """`epochs` passes over `batch` in mini-batches of `rows` rows (the last one smaller if it does not divide)."""
    for _ in range(epochs):
        order = torch.randperm(batch.batch_size, generator=generator) if shuffle else torch.arange(batch.batch_size)
        yield from batch.select(order).split(rows)
