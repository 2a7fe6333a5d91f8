"""Padding removal for varlen attention, and token-budget bin packing for dynamic micro-batches.

Packing concatenates the real tokens of every row into one `[1, nnz]` stream whose `position_ids` restart at 0
for each sequence. The forwards hand the boundaries `cu_seqlens` to the attention (see
`attention.packed_attention_kwargs`), which attends within each sequence only: flash-attention's varlen kernel,
or rlloom's `sdpa_varlen` (torch's `varlen_attn`, or SDPA per sequence) with no mask at all; transformers'
plain sdpa or eager detect the layout from the restarting positions and build a dense block-diagonal mask.
`unpack` is the exact inverse for any per-token output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class PackedSequences:
    """Real tokens of a padded `[B, L]` batch laid end to end."""

    input_ids: torch.Tensor  # [1, nnz]
    position_ids: torch.Tensor  # [1, nnz], restarting at 0 for each sequence
    cu_seqlens: torch.Tensor  # [B + 1] int32, sequence boundaries in the stream (flash-attn's convention)
    indices: torch.Tensor  # [nnz] flat positions in the padded [B * L] layout
    padded_shape: tuple[int, int]

    @property
    def max_seqlen(self) -> int:
        return int((self.cu_seqlens[1:] - self.cu_seqlens[:-1]).max()) if self.cu_seqlens.numel() > 1 else 0


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedSequences:
    """Remove padding: keep tokens where `attention_mask` is 1, row by row, in order."""
    if input_ids.shape != attention_mask.shape or input_ids.ndim != 2:
        raise ValueError(
            f"pack: input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} "
            "must both be [batch, length]"
        )
    mask = attention_mask.bool()
    indices = mask.flatten().nonzero().squeeze(-1)
    lengths = mask.sum(-1)
    cu_seqlens = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=input_ids.device)
    cu_seqlens[1:] = lengths.cumsum(0)
    # Position within its own sequence: global index minus the start of the sequence it belongs to.
    seq_of_token = torch.repeat_interleave(torch.arange(lengths.numel(), device=input_ids.device), lengths)
    positions = torch.arange(indices.numel(), device=input_ids.device) - cu_seqlens[:-1].long()[seq_of_token]
    return PackedSequences(
        input_ids=input_ids.flatten()[indices].unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        cu_seqlens=cu_seqlens,
        indices=indices,
        padded_shape=(int(input_ids.shape[0]), int(input_ids.shape[1])),
    )


def unpack(
    values: torch.Tensor, packed: PackedSequences, fill: float = 0.0, *, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Put per-token `values` (`[nnz, ...]` or `[1, nnz, ...]`) back into the padded `[B, L, ...]` layout.
    With `positions` (stream indices), `values` hold only those tokens' values and every other cell gets `fill`."""
    indices = packed.indices if positions is None else packed.indices[positions]
    if values.ndim >= 2 and values.shape[0] == 1 and values.shape[1] == indices.numel():
        values = values[0]
    if values.shape[0] != indices.numel():
        raise ValueError(f"unpack: got {values.shape[0]} values for {indices.numel()} packed tokens")
    bsz, length = packed.padded_shape
    out = values.new_full((bsz * length, *values.shape[1:]), fill)
    out[indices] = values
    return out.view(bsz, length, *values.shape[1:])


def token_budget_bins(
    lengths: Sequence[int],
    max_tokens: int,
    *,
    padded: bool = True,
    prompt_lengths: Sequence[int] | None = None,
) -> list[list[int]]:
    """Group row indices into bins of at most `max_tokens` tokens; every row lands in exactly one bin.

    Rows are visited longest first. Packed cost (`padded=False`) is the sum of lengths, filled first-fit so
    short rows top up earlier bins. Padded cost is rows x padded width, so bins take consecutive rows of similar
    length; with `prompt_lengths` the width is (longest prompt + longest response), the layout of a
    left-padded prompt and right-padded response. A row longer than the budget gets a bin of its own rather
    than an error. Rows keep their original order inside each bin.
    """
    if max_tokens < 1:
        raise ValueError(f"token_budget_bins: max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    if padded:
        plens = prompt_lengths if prompt_lengths is not None else [0] * len(lengths)
        width_p = width_r = 0
        for i in order:
            wp, wr = max(width_p, plens[i]), max(width_r, lengths[i] - plens[i])
            if bins and (len(bins[-1]) + 1) * (wp + wr) <= max_tokens:
                bins[-1].append(i)
                width_p, width_r = wp, wr
            else:
                bins.append([i])
                width_p, width_r = plens[i], lengths[i] - plens[i]
    else:
        loads: list[int] = []
        for i in order:
            for b, load in enumerate(loads):
                if load + lengths[i] <= max_tokens:
                    bins[b].append(i)
                    loads[b] += lengths[i]
                    break
            else:
                bins.append([i])
                loads.append(lengths[i])
    return [sorted(b) for b in bins]
