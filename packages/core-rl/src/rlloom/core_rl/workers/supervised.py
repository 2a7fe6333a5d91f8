"""Supervised steps on trajectories through the actor's own forward (a warm-up before RL, and PPO-ptx's loss).

RL on a tiny or untrained model has no signal until some samples succeed; a little cross-entropy on
demonstrations gives it a start. The loss goes through `forward.response_logprobs`, the forward the policy
loss uses, so whatever the actor supports, this does too: padded text rows, and vision-language rows with their
own image inputs and M-RoPE positions (`Trajectory.multimodal`). Only loss-mask-1 response tokens are trained,
so the same call warms up a single-turn answer (mask all 1) or an agent conversation (observations and template
glue mask 0), and the prompt's logits are never computed (`logits_to_keep`). It lives with the workers, not with the
pure losses of `algorithms/`, because it runs the model.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.workers.forward import response_logprobs


def supervised_nll_sum(model: nn.Module, batch: TrajectoryBatch, *, packed: bool = False) -> torch.Tensor:
    """Σ −log p of the loss-mask-1 response tokens of `batch` (on the model's device); callers divide by the token
    count of the whole batch, so micro-batches of one batch add up to its mean."""
    logprobs, _ = response_logprobs(model, batch, packed=packed)
    return -(logprobs * batch.loss_mask.to(logprobs.dtype)).sum()


def supervised_loss(model: nn.Module, trajectories: Sequence[Trajectory], *, pad_token_id: int) -> torch.Tensor:
    """Mean negative log-likelihood of the loss-mask-1 response tokens, over all such tokens of the batch."""
    batch = TrajectoryBatch.from_trajectories(list(trajectories), pad_token_id)
    device = next(model.parameters()).device
    batch = batch.to(device)
    tokens = batch.loss_mask.sum()
    if float(tokens) == 0:
        raise ValueError("supervised_loss: no response token has loss mask 1; nothing to learn from")
    return supervised_nll_sum(model, batch) / tokens


def supervised_train(
    model: nn.Module,
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    steps: int,
    batch_size: int = 16,
    lr: float = 1e-3,
    seed: int = 0,
    stop: Callable[[int], bool] | None = None,
    check_every: int = 20,
    progress: bool = True,
) -> list[float]:
    """AdamW steps on random batches of `trajectories`; returns the losses.

    Batches are drawn from the trajectories that have a loss-mask-1 token (one with none adds no loss). `stop(step)`
    is asked every `check_every` steps, with the model in eval mode, and ends training when it returns True (e.g.
    "the model already answers 30% of the training prompts": stopping early leaves RL something to do).
    """
    if steps < 0 or batch_size < 1 or check_every < 1:
        raise ValueError(
            f"need steps >= 0, batch_size >= 1, check_every >= 1; got {steps}, {batch_size}, {check_every}"
        )
    trainable = [t for t in trajectories if t.num_model_tokens]
    if steps and not trainable:
        raise ValueError(
            f"supervised_train got {len(trajectories)} trajectories and none has a loss-mask-1 token "
            "(a model-written token) to learn from"
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    losses: list[float] = []
    model.train()
    bar = tqdm(range(1, steps + 1), desc="warm-up", disable=not progress, mininterval=2.0)
    for step in bar:
        picked = [trainable[rng.randrange(len(trainable))] for _ in range(batch_size)]
        loss = supervised_loss(model, picked, pad_token_id=pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        if stop is not None and step % check_every == 0:
            model.eval()
            done = stop(step)
            model.train()
            if done:
                break
    bar.close()
    model.eval()
    return losses
