"""AdamW with warm-up + constant or cosine learning-rate schedules, and the PPO mini-batch iteration.

Schedules come from transformers (well kept, and their state is a plain LambdaLR step count, so checkpoints
restore them exactly). The scheduler steps once per training step, not per optimizer step, so `warmup_steps`
(or `warmup_ratio` of the run) and `total_steps` mean what a user reads in the config whatever the mini-batch
count.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers.optimization import (
    get_constant_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
)

from rlloom.core_rl.config.schema import ActorConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: ActorConfig, total_steps: int
) -> tuple[torch.optim.AdamW, LambdaLR]:
    """AdamW over the trainable `params` and its schedule over `total_steps` training steps."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ValueError("build_optimizer: the model has no trainable parameters (all requires_grad=False)")
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, foreach=True)
    warmup = cfg.warmup_steps_for(total_steps)  # `warmup_ratio` of the run, else `warmup_steps`
    if cfg.lr_schedule == "cosine":
        scheduler = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=max(total_steps, warmup + 1),
            min_lr_rate=cfg.min_lr_ratio,
        )
    else:
        scheduler = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
    return optimizer, scheduler


def ppo_minibatches(
    batch: TrajectoryBatch, rows: int, *, epochs: int, shuffle: bool, generator: torch.Generator
) -> Iterator[TrajectoryBatch]:
    """`epochs` passes over `batch` in mini-batches of `rows` rows (the last one smaller if it does not divide)."""
    for _ in range(epochs):
        order = torch.randperm(batch.batch_size, generator=generator) if shuffle else torch.arange(batch.batch_size)
        yield from batch.select(order).split(rows)


def single_optimizer_step(rows: int, mini_batch_rows: int, *, epochs: int) -> bool:
    """Whether `ppo_minibatches` gives `rows` rows exactly one optimizer step (one epoch, one mini-batch): the
    weights then cannot move between an old-log-prob forward and the update, so the update's own log-probs, detached,
    can serve as the old ones."""
    return epochs == 1 and rows <= mini_batch_rows


def clipped_optimizer_step(
    params: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer, grad_clip: float | None
) -> torch.Tensor:
    """Clip gradients to `grad_clip` (None: no clipping), step only when the norm is finite, clear gradients.

    Skipping the step on an inf/nan norm keeps one bad micro-batch from destroying the weights; the caller logs
    the returned norm so the skip is visible.
    """
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip is not None else float("inf"))
    if hasattr(grad_norm, "full_tensor"):  # FSDP2 shards: a DTensor holding the norm over every rank's shard
        grad_norm = grad_norm.full_tensor()
    if torch.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def training_state(optimizer: torch.optim.Optimizer, scheduler: LambdaLR, generator: torch.Generator) -> dict[str, Any]:
    """What a worker must checkpoint besides its weights to resume exactly."""
    return {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "generator": generator.get_state(),
    }


def load_training_state(
    state: Mapping[str, Any], optimizer: torch.optim.Optimizer, scheduler: LambdaLR, generator: torch.Generator
) -> None:
    with configured_hyperparameters(optimizer, scheduler):
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"])


_CONFIGURED_KEYS = ("betas", "weight_decay", "eps", "initial_lr")


@contextmanager
def configured_hyperparameters(optimizer: torch.optim.Optimizer, scheduler: LambdaLR) -> Iterator[None]:
    """Around loading a checkpoint's optimizer and scheduler state: keep the moments and the schedule's position
    from the checkpoint, but the peak lr, betas and weight decay of the config the run resumes with.

    `load_state_dict` restores the saved param groups' hyperparameters and the scheduler's `base_lrs`, so a resumed
    run with a new `actor.lr` kept training at the old one while its config.yaml (and the resume warning) said the
    new one. With an unchanged config the lr comes out bit for bit as saved (the same base · lambda(step)).
    """
    configured = [{k: g[k] for k in _CONFIGURED_KEYS if k in g} for g in optimizer.param_groups]
    base_lrs = list(scheduler.base_lrs)
    yield
    scheduler.base_lrs = base_lrs
    lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, values, lr in zip(optimizer.param_groups, configured, lrs, strict=True):
        group.update(values)
        group["lr"] = lr
    scheduler._last_lr = lrs
