"""Re-prefill after an in-flight weight update (`HFEngineConfig(inflight_kv="reprefill")`).

When a decode parks for a weight update, its rows' keys and values were computed by the old weights. Kept
(`inflight_kv="keep"`, AReaL's practice), they cost nothing, but every token sampled after the resume comes
from the new weights reading old-weight keys/values: a mixture that neither policy would sample, which the
decoupled loss's proximal policy then has to absorb. Re-prefilled, every row's prompt plus the tokens fed so far
run through the new weights once, so each token sampled after the resume is exactly the new policy's given its
prefix, at the price of one prefill of prompt + tokens per row per push (what vLLM's pause-abort-resubmit and
its preemption cost too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache

from rlloom.rollout.hf.kv_cache import cache_keyword


@dataclass(slots=True)
class FreshCache:
    """Keys/values of left-padded sequences, with their attention mask and each row's last position."""

    cache: DynamicCache
    mask: torch.Tensor  # [B, W] long, 0 on the left padding
    last_pos: torch.Tensor  # [B, 1] the position of each row's last token


def prefill_sequences(model: torch.nn.Module, sequences: Sequence[list[int]], pad_token_id: int) -> FreshCache:
    """Run `sequences` (token ids, each non-empty) through the model's current weights into a new cache.

    Left padding with explicit position ids, as `RunningBatch.prefill` does, so a padded row's numbers are those
    of an unpadded one and the next token fed continues at `last_pos + 1`. Only the last position's logits are
    computed (the caller feeds a token next and needs none).
    """
    device = next(model.parameters()).device
    ids = pad_sequence(
        [torch.tensor(s, dtype=torch.long) for s in sequences],
        batch_first=True,
        padding_value=pad_token_id,
        padding_side="left",
    ).to(device)
    mask = pad_sequence(
        [torch.ones(len(s), dtype=torch.long) for s in sequences], batch_first=True, padding_side="left"
    ).to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=getattr(model, "config", None))
    kwargs = {cache_keyword(model): cache}
    model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1, **kwargs)
    return FreshCache(cache=cache, mask=mask, last_pos=positions[:, -1:])
