"""Supervised steps on trajectories through the actor's own model (a warm-up before RL, and PPO-ptx's loss).

RL on a tiny or untrained model has no signal until some samples succeed; a little cross-entropy on
demonstrations gives it a start. Only loss-mask-1 response tokens are trained, so the same call warms up a
single-turn answer (mask all 1) or an agent conversation (observations and template glue mask 0).

Memory: an agent demonstration is mostly context (SmolLM2-135M on HotpotQA: ~485 tokens, 62 of them the model's),
and a float32 step kept ~1.5 MB of activations per forwarded token, 6.2 GB for 8 such rows, plus the
`[tokens, vocab]` logits and their gradient. So (1) the LM head runs only on the hidden states that score a
trained token (`lm_head_on`): 5x fewer logits there, the same loss; (2) a step's rows go through forward and
backward in micro-batches of at most `max_tokens_per_micro_batch` tokens, each part divided by the whole batch's
token count so the gradients add up to the full batch's mean; (3) `gradient_checkpointing` trades a second forward
for keeping only each layer's input. Vision-language rows with their own M-RoPE positions keep the actor's
per-row forward (`forward.response_logprobs`). It lives with the workers, not with the pure losses of
`algorithms/`, because it runs the model.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from tqdm.auto import tqdm

from rlloom.core_rl.algorithms import logprobs_from_logits
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.workers.forward import response_logprobs, rope_rows, scored_logits

DEFAULT_MICRO_BATCH_TOKENS = 1024
"""Tokens per forward/backward in `supervised_train`. SmolLM2-135M in float32 keeps ~1.5 MB of activations per
token: the search recipe's 8 demonstrations (~500 tokens each) in one forward peaked at 9.5 GiB RSS, in 2,048-token
micro-batches 6.6 GiB, in 1,024-token ones 4.6 GiB; one forward+backward of 4 of them took the same CPU time in
1,024-token micro-batches as in one forward (17.9 vs 18.2 s single-threaded, loaded host)."""


def supervised_nll_sum(
    model: nn.Module, batch: TrajectoryBatch, *, packed: bool = False, restrict_head: bool = True
) -> torch.Tensor:
    """Σ −log p (weighted by the loss mask) of the loss-mask-nonzero response tokens of `batch` (on the model's
    device); callers divide by the token count of the whole batch, so micro-batches of one batch add up to its mean.

    With `restrict_head` (and text rows, a prompt, and output embeddings) the LM head runs only on the positions
    that score those tokens (`lm_head_on`); otherwise through the actor's `response_logprobs` (full response
    logits). Both give the same value and gradients (tested)."""
    width_p = batch.prompt_width
    plain = not restrict_head or width_p == 0 or rope_rows(batch) or not hasattr(model, "get_output_embeddings")
    if plain:
        logprobs, _ = response_logprobs(model, batch, packed=packed)
        return -(logprobs * batch.loss_mask.to(logprobs.dtype)).sum()
    [(wanted, logits)] = scored_logits(model, batch, batch.loss_mask != 0, packed=packed, share_prompts=False)
    logprobs = logprobs_from_logits(logits, batch.responses[wanted])
    return -(logprobs * batch.loss_mask[wanted].to(logprobs.dtype)).sum()


def _batch(model: nn.Module, trajectories: Sequence[Trajectory], pad_token_id: int) -> tuple[TrajectoryBatch, float]:
    """The padded batch on the model's device and its trained-token weight (the mean's divisor)."""
    batch = TrajectoryBatch.from_trajectories(list(trajectories), pad_token_id)
    batch = batch.to(next(model.parameters()).device)
    tokens = float(batch.loss_mask.sum())
    if tokens == 0:
        raise ValueError("supervised_loss: no response token has loss mask 1; nothing to learn from")
    return batch, tokens


def supervised_loss(model: nn.Module, trajectories: Sequence[Trajectory], *, pad_token_id: int) -> torch.Tensor:
    """Mean negative log-likelihood of the loss-mask-1 response tokens, over all such tokens of the batch (one
    forward; `supervised_backward` is the same mean in micro-batches)."""
    batch, tokens = _batch(model, trajectories, pad_token_id)
    return supervised_nll_sum(model, batch) / tokens


def supervised_backward(
    model: nn.Module,
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    max_tokens_per_micro_batch: int | None = DEFAULT_MICRO_BATCH_TOKENS,
) -> float:
    """Backpropagate the mean NLL of `supervised_loss` micro-batch by micro-batch (rows binned by padded width,
    at most `max_tokens_per_micro_batch` tokens each, a longer row alone; None: one forward) and return its value;
    the accumulated gradients equal the full batch's."""
    batch, tokens = _batch(model, trajectories, pad_token_id)
    if max_tokens_per_micro_batch is None:
        micro_batches = [batch]
    else:
        micro_batches = [micro for _, micro in batch.micro_batches(max_tokens_per_micro_batch, padded=True)]
    total = 0.0
    for micro in micro_batches:
        if not bool((micro.loss_mask != 0).any()):
            continue  # a micro-batch of rows with nothing trained adds nothing
        part = supervised_nll_sum(model, micro) / tokens
        part.backward()  # type: ignore[no-untyped-call]
        total += float(part.detach())
    return total


@contextmanager
def checkpointing(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Activation checkpointing on the model for the duration (non-reentrant), then off again; transformers 5
    names it `activation_checkpointing_*`, 4.x `gradient_checkpointing_*`."""
    kind = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
    was = bool(getattr(model, f"is_{kind}_checkpointing", False))
    if not enabled or was:
        yield
        return
    enable = getattr(model, f"{kind}_checkpointing_enable", None)
    if enable is None:
        raise ValueError(
            f"gradient_checkpointing=True needs a transformers model; {type(model).__name__} has no "
            "gradient_checkpointing_enable (set gradient_checkpointing=False)"
        )
    enable(**{f"{kind}_checkpointing_kwargs": {"use_reentrant": False}})
    try:
        yield
    finally:
        getattr(model, f"{kind}_checkpointing_disable")()


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
    max_tokens_per_micro_batch: int | None = DEFAULT_MICRO_BATCH_TOKENS,
    gradient_checkpointing: bool = False,
) -> list[float]:
    """AdamW steps on random batches of `trajectories`; returns the losses.

    Batches are drawn from the trajectories that have a loss-mask-1 token (one with none adds no loss). `stop(step)`
    is asked every `check_every` steps, with the model in eval mode, and ends training when it returns True (e.g.
    "the model already answers 30% of the training prompts": stopping early leaves RL something to do). Each step
    runs in micro-batches of `max_tokens_per_micro_batch` tokens (None: the whole batch at once), optionally with
    activation checkpointing; neither changes the loss, only the memory and time a step takes.
    """
    if steps < 0 or batch_size < 1 or check_every < 1:
        raise ValueError(
            f"need steps >= 0, batch_size >= 1, check_every >= 1; got {steps}, {batch_size}, {check_every}"
        )
    if max_tokens_per_micro_batch is not None and max_tokens_per_micro_batch < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1 or None, got {max_tokens_per_micro_batch}")
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
    with checkpointing(model, gradient_checkpointing):
        for step in bar:
            picked = [trainable[rng.randrange(len(trainable))] for _ in range(batch_size)]
            optimizer.zero_grad(set_to_none=True)
            loss = supervised_backward(
                model, picked, pad_token_id=pad_token_id, max_tokens_per_micro_batch=max_tokens_per_micro_batch
            )
            optimizer.step()
            losses.append(loss)
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
