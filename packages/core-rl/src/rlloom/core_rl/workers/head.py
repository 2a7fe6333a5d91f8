"""The LM head on only the hidden states that score a wanted token.

A forward's logits are `[tokens, vocab]` (49k columns for SmolLM2, 152k for Qwen2.5), and in backward as many
again; a loss that reads only some tokens' log-probs (the supervised warm-up's trained tokens, the policy loss's
loss-mask-1 tokens of an agent conversation whose retrieved passages are most of its response) need not compute
the rest. `lm_head_on` gathers the wanted hidden states before the head, so the model's forward returns their
logits only; `scoring_positions` says which columns those are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from rlloom.core_rl.contracts.batch import TrajectoryBatch


def scoring_positions(batch: TrajectoryBatch, scored: torch.Tensor | None = None) -> torch.Tensor:
    """`[b, P+R]` bool: the columns whose hidden state predicts a `scored` response token (`[b, R]`, default the
    trained ones, loss mask != 0; padding never). Response token j sits at column P + j and is predicted from
    column P + j - 1; row-major order matches `batch.responses[scored]`."""
    if scored is None:
        scored = batch.loss_mask != 0
    width_p = batch.prompt_width
    scoring = torch.zeros_like(batch["attention_mask"], dtype=torch.bool)
    scoring[:, width_p - 1 : -1] = scored.bool() & batch.response_attention_mask.bool()
    return scoring


def has_output_head(model: nn.Module) -> bool:
    """Whether the model exposes its LM head as a module (`get_output_embeddings`), which `lm_head_on` hooks."""
    getter = getattr(model, "get_output_embeddings", None)
    return callable(getter) and isinstance(getter(), nn.Module)


@contextmanager
def lm_head_on(model: nn.Module, positions: torch.Tensor) -> Iterator[None]:
    """While open, the model's output embeddings (LM head) see only the hidden states at `positions` (a bool mask
    over the hidden states' leading dims), gathered into one `[1, n, H]` row, so the forward's logits are `[1, n, V]`.
    A pre-hook rather than a separate `lm_head(decoder(...))` call keeps whatever the model's forward does after its
    head (Gemma's soft-capping, Cohere's logit scale) exactly as the full forward would."""
    head = model.get_output_embeddings()  # type: ignore[operator]
    if not isinstance(head, nn.Module):
        raise TypeError(f"{type(model).__name__} has no output embeddings module to restrict to the trained tokens")

    def gather(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]
        if hidden.shape[:-1] != positions.shape:
            raise RuntimeError(
                f"lm_head_on: the LM head got hidden states {tuple(hidden.shape)}, expected {tuple(positions.shape)} "
                "x hidden; this model does not run its head on the full sequence (use supervised_nll_sum(..., "
                "restrict_head=False), or set actor.restrict_lm_head=false)"
            )
        return (hidden[positions].unsqueeze(0), *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        yield
    finally:
        handle.remove()
