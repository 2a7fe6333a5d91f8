"""Supervised warm-up on agent trajectories: teacher forcing on the tokens the policy wrote, nothing else.

RL on a tiny or untrained model has no signal until some rollouts succeed. A few hundred steps of cross-entropy on
demonstration conversations (made with `AgentLoop` itself, so the token layout is exactly what RL will sample)
gives it a start. The loss covers the trajectory's loss-mask-1 tokens only: prompts, observations and template
glue are context, as they are for the policy loss.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from rlloom.core_rl.trajectory import Trajectory

IGNORE = -100  # transformers' label for "no loss here"


def warmup_examples(trajectories: Sequence[Trajectory]) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) per trajectory: labels are the ids where the loss mask is 1, IGNORE elsewhere."""
    out = []
    for t in trajectories:
        ids = [*t.prompt_ids, *t.response_ids]
        labels = [IGNORE] * len(t.prompt_ids) + [
            x if m else IGNORE for x, m in zip(t.response_ids, t.loss_mask, strict=True)
        ]
        out.append((ids, labels))
    return out


def supervised_warmup(
    model: nn.Module,
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    steps: int,
    batch_size: int = 16,
    lr: float = 2e-3,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """Train `model` in place for `steps` AdamW steps on random batches of `trajectories`; returns the losses."""
    if steps < 0 or batch_size < 1:
        raise ValueError(f"warm-up needs steps >= 0 and batch_size >= 1, got steps={steps}, batch_size={batch_size}")
    examples = [e for e in warmup_examples(trajectories) if any(label != IGNORE for label in e[1])]
    if steps and not examples:
        raise ValueError("warm-up got no trajectory with a model token (loss mask 1) to learn from")
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    losses: list[float] = []
    model.train()
    bar = tqdm(range(steps), desc="warm-up", disable=not progress, mininterval=2.0)
    for _ in bar:
        picked = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in picked)
        input_ids = torch.full((batch_size, width), pad_token_id)
        labels = torch.full((batch_size, width), IGNORE)
        attention = torch.zeros((batch_size, width), dtype=torch.long)
        for row, (ids, labs) in enumerate(picked):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(labs)] = torch.tensor(labs)
            attention[row, : len(ids)] = 1
        out = model(input_ids=input_ids.to(device), attention_mask=attention.to(device), labels=labels.to(device))
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        losses.append(float(out.loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    model.eval()
    return losses
