"""How a per-token loss matrix L[B, T] becomes one scalar (`loss_agg_mode`), micro-batch safe.

The modes differ in how much each token and each sequence weighs, which is exactly what GRPO, DAPO and Dr.GRPO
disagree about. With gradient accumulation over micro-batches (and data-parallel ranks), a mean must divide by the
count over the WHOLE mini-batch, not per micro-batch, or short micro-batches are over-weighted (a known veRL/TRL
pitfall); pass `global_token_count` / `global_seq_count` and the micro-batch losses sum to the full-batch loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from torch import Tensor

from rlloom.core_rl.algorithms.masked_stats import check_same_shape, masked_sum
from rlloom.core_rl.algorithms.registry import UnknownNameError, unknown_name_message

AggMode: TypeAlias = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "bnpo"
]
AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "bnpo",
)

Count: TypeAlias = float | Tensor


@dataclass(frozen=True)
class LossAggregation:
    """An aggregation mode plus the normalisers the trainer knows and one micro-batch does not.

    global_token_count: valid tokens in the whole mini-batch (all micro-batches, all ranks) for `token-mean`.
    global_seq_count: sequences with at least one valid token in the whole mini-batch, for the `seq-mean-*` modes.
    norm_length: the constant length C of `seq-mean-token-sum-norm` (Dr.GRPO uses the max response length).
    global_micro_batch_count: micro-batches of the whole mini-batch (all ranks) that carry rows, for `bnpo`.
    """

    mode: str = "token-mean"
    global_token_count: Count | None = None
    global_seq_count: Count | None = None
    norm_length: float | None = None
    global_micro_batch_count: Count | None = None

    def __post_init__(self) -> None:
        if self.mode not in AGG_MODES:
            raise UnknownNameError(unknown_name_message("loss aggregation mode", self.mode, list(AGG_MODES)))
        for name in ("global_token_count", "global_seq_count", "norm_length", "global_micro_batch_count"):
            value = getattr(self, name)
            if isinstance(value, int | float) and value <= 0:
                raise ValueError(f"LossAggregation.{name} must be positive, got {value}")


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    global_token_count: Count | None = None,
    global_seq_count: Count | None = None,
    norm_length: float | None = None,
    global_micro_batch_count: Count | None = None,
) -> Tensor:
    """Reduce L[B, T] over the valid tokens (mask = 1) to a scalar. With S = sequences that have a valid token:

    - `token-mean`:              Σᵢₜ Lᵢₜmᵢₜ / Σᵢₜ mᵢₜ  (DAPO's token-level loss; every token weighs the same)
    - `seq-mean-token-sum`:      (1/|S|) Σᵢ Σₜ Lᵢₜmᵢₜ
    - `seq-mean-token-mean`:     (1/|S|) Σᵢ (Σₜ Lᵢₜmᵢₜ / Σₜ mᵢₜ)  (original GRPO; GSPO)
    - `seq-mean-token-sum-norm`: (1/|S|) Σᵢ Σₜ Lᵢₜmᵢₜ / C, C a constant length (Dr.GRPO, Liu et al. 2025)
    - `bnpo`:                    Σᵢₜ Lᵢₜmᵢₜ / Σᵢₜ mᵢₜ / M  (TRL's bnpo: THIS micro-batch's token mean, divided by
                                 the M micro-batches of the mini-batch over all ranks, so the summed gradients are
                                 the mean of the micro-batch token means, as TRL's accumulation and DDP average them)

    The denominators Σm and |S| are replaced by `global_token_count` / `global_seq_count` when given (gradient
    accumulation; `bnpo` keeps its own micro-batch's Σm by definition and divides by `global_micro_batch_count`,
    default 1); C defaults to the padded length T, which is only constant if every micro-batch has the same T.
    Masked entries are excluded with `where`, so they get exactly zero gradient even if L is inf/nan there.
    """
    agg = LossAggregation(mode, global_token_count, global_seq_count, norm_length, global_micro_batch_count)
    check_same_shape(loss=loss, mask=mask)
    if loss.dim() != 2:
        raise ValueError(f"loss must be [B, T], got shape {tuple(loss.shape)}")
    valid = mask.bool()
    if agg.mode == "token-mean":
        tokens = agg.global_token_count if agg.global_token_count is not None else valid.sum().clamp(min=1)
        return masked_sum(loss, valid) / tokens
    if agg.mode == "bnpo":
        micro_batches = agg.global_micro_batch_count if agg.global_micro_batch_count is not None else 1.0
        return masked_sum(loss, valid) / valid.sum().clamp(min=1) / micro_batches
    seq_tokens = valid.sum(-1)
    seqs = agg.global_seq_count if agg.global_seq_count is not None else (seq_tokens > 0).sum().clamp(min=1)
    seq_sums = masked_sum(loss, valid, dim=-1)
    if agg.mode == "seq-mean-token-sum":
        return seq_sums.sum() / seqs
    if agg.mode == "seq-mean-token-mean":
        return (seq_sums / seq_tokens.clamp(min=1).to(seq_sums.dtype)).sum() / seqs
    length = agg.norm_length if agg.norm_length is not None else float(loss.shape[-1])
    return seq_sums.sum() / (seqs * length)


def aggregate_with(loss: Tensor, mask: Tensor, agg: str | LossAggregation) -> Tensor:
    """`aggregate` driven by a mode name or a `LossAggregation` (what the losses accept as `agg=`)."""
    if isinstance(agg, str):
        agg = LossAggregation(agg)
    return aggregate(
        loss,
        mask,
        agg.mode,
        global_token_count=agg.global_token_count,
        global_seq_count=agg.global_seq_count,
        norm_length=agg.norm_length,
        global_micro_batch_count=agg.global_micro_batch_count,
    )


def token_and_seq_counts(mask: Tensor) -> tuple[Tensor, Tensor]:
    """(valid tokens, sequences with ≥ 1 valid token) of a mini-batch: the global normalisers to pass down."""
    valid = mask.bool()
    return valid.sum(), (valid.sum(-1) > 0).sum()


__all__ = ["AGG_MODES", "AggMode", "LossAggregation", "aggregate", "aggregate_with", "token_and_seq_counts"]
