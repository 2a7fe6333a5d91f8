"""Token log-probabilities and entropies from logits, chunked so the [N, V] float32 temporaries stay small.

A 150k-token vocabulary makes `log_softmax` over a full [B·T, V] batch the largest tensor of an update step; here
rows are processed `chunk_size` at a time, each chunk upcast to float32 (bf16 logits keep their precision without
a full float32 copy), and `logsumexp` replaces the materialised log-softmax.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK_SIZE = 256


def _check_chunk(chunk_size: int) -> None:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1 (rows of logits per chunk), got {chunk_size}")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """bf16/fp16 → float32; float32 and float64 are kept."""
    return torch.promote_types(dtype, torch.float32)


def _upcast(logits: Tensor) -> Tensor:
    return logits.to(_compute_dtype(logits.dtype))


def _token_logprobs(logits: Tensor, ids: Tensor) -> Tensor:
    logits = _upcast(logits)
    picked = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def logprobs_from_logits(logits: Tensor, token_ids: Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """log softmax(logits)[token_id] = logit[token_id] − logsumexp(logits), for logits [..., V] and ids [...].

    Returns log-probs (at least float32) of shape `token_ids.shape`, equal to `log_softmax(logits).gather(ids)`
    without building the [..., V] log-softmax; differentiable.
    """
    _check_chunk(chunk_size)
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(
            f"logits [..., V] and token_ids [...] must share leading dims, got {tuple(logits.shape)} and "
            f"{tuple(token_ids.shape)}"
        )
    vocab = logits.shape[-1]
    if bool(((token_ids < 0) | (token_ids >= vocab)).any()):  # on GPU, gather would die with a device assert
        raise ValueError(f"token_ids must lie in [0, {vocab}) (the logits' vocabulary size)")
    flat_logits = logits.reshape(-1, vocab)
    flat_ids = token_ids.reshape(-1).long()
    # Low-precision logits are upcast per chunk; autograd would keep every chunk's float32 copy for logsumexp's
    # backward, so recompute the chunk in backward instead (float32/64 logits have no copy to save).
    recompute = torch.is_grad_enabled() and logits.requires_grad and _compute_dtype(logits.dtype) != logits.dtype
    chunks: list[Tensor] = []
    for i in range(0, flat_logits.shape[0], chunk_size):
        part, ids = flat_logits[i : i + chunk_size], flat_ids[i : i + chunk_size]
        chunks.append(
            checkpoint(_token_logprobs, part, ids, use_reentrant=False) if recompute else _token_logprobs(part, ids)
        )
    out = torch.cat(chunks) if chunks else flat_logits.new_zeros(0, dtype=_compute_dtype(logits.dtype))
    return out.reshape(token_ids.shape)


def _entropy(logits: Tensor) -> Tensor:
    logits = _upcast(logits)
    lse = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    return lse - (probs * logits).sum(-1)


def entropy_from_logits(logits: Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """H = −Σ p log p = logsumexp(l) − Σ softmax(l)·l per row of logits [..., V]; returns [...] (≥ float32).

    When a gradient is needed, each chunk is recomputed in backward (activation checkpointing), so only one
    chunk's [chunk, V] softmax is alive at a time instead of one per chunk (for an entropy bonus over long
    responses).
    """
    _check_chunk(chunk_size)
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    recompute = torch.is_grad_enabled() and logits.requires_grad
    chunks: list[Tensor] = []
    for i in range(0, flat.shape[0], chunk_size):
        part = flat[i : i + chunk_size]
        chunks.append(checkpoint(_entropy, part, use_reentrant=False) if recompute else _entropy(part))
    out = torch.cat(chunks) if chunks else flat.new_zeros(0, dtype=_compute_dtype(logits.dtype))
    return out.reshape(logits.shape[:-1])
