"""Forward passes over a (micro-)batch that return per-response-token quantities.

The logit at position t predicts token t+1, so response token j (column P + j) is scored by the logits at column
P + j − 1; `[:, P-1:-1]` in the padded layout. The packed (padding-free) path runs the real tokens as one stream
with restarting position ids and maps results back with `unpack`; both paths give the same numbers (tested).
Temperature divides the logits so training log-probs match the distribution the engine sampled from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from rlloom.core_rl.algorithms import entropy_from_logits, logprobs_from_logits
from rlloom.core_rl.batch import TrajectoryBatch
from rlloom.core_rl.packing import pack, unpack

CHUNK_ELEMENTS = 256 * 32_768
"""Logit elements per chunk of the log-prob/entropy reductions (32 MiB in float32): chunking by elements rather
than rows keeps a 150k vocabulary's temporaries small and lets a small vocabulary run in one chunk, where
splitting would only add per-op overhead."""


def _chunk_rows(vocab: int) -> int:
    return max(256, CHUNK_ELEMENTS // max(vocab, 1))


def response_logprobs(
    model: nn.Module, batch: TrajectoryBatch, *, temperature: float = 1.0, packed: bool = False, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs `[b, R]`, entropies `[b, R]` or None) of the response tokens; 0 on padding."""
    width_p = batch.prompt_width
    if packed:
        seqs = pack(batch["input_ids"], batch["attention_mask"])
        logits = model(input_ids=seqs.input_ids, position_ids=seqs.position_ids, use_cache=False).logits[0]
        logits = logits / temperature
        # Next token in the stream; at a sequence's last token this is the next sequence's first token, a junk
        # value that unpacks onto the response column after the last real token, which is padding.
        next_ids = torch.roll(seqs.input_ids[0], -1)
        rows = _chunk_rows(logits.shape[-1])
        logprobs = unpack(logprobs_from_logits(logits, next_ids, chunk_size=rows), seqs)[:, width_p - 1 : -1]
        ent = unpack(entropy_from_logits(logits, chunk_size=rows), seqs)[:, width_p - 1 : -1] if entropy else None
    else:
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            use_cache=False,
        )
        logits = out.logits[:, width_p - 1 : -1] / temperature
        rows = _chunk_rows(logits.shape[-1])
        logprobs = logprobs_from_logits(logits, batch.responses, chunk_size=rows)
        ent = entropy_from_logits(logits, chunk_size=rows) if entropy else None
    mask = batch.response_attention_mask.bool()
    logprobs = torch.where(mask, logprobs, torch.zeros_like(logprobs))
    if ent is not None:
        ent = torch.where(mask, ent, torch.zeros_like(ent))
    return logprobs, ent


def response_hidden_states(backbone: nn.Module, batch: TrajectoryBatch, *, packed: bool = False) -> torch.Tensor:
    """Last hidden states `[b, R, H]` at the positions that precede each response token (the critic's states)."""
    width_p = batch.prompt_width
    if packed:
        seqs = pack(batch["input_ids"], batch["attention_mask"])
        hidden = backbone(input_ids=seqs.input_ids, position_ids=seqs.position_ids, use_cache=False)
        return unpack(hidden.last_hidden_state[0], seqs)[:, width_p - 1 : -1]
    hidden = backbone(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    )
    return hidden.last_hidden_state[:, width_p - 1 : -1]


@contextlib.contextmanager
def autocast(device: torch.device, enabled: bool) -> Iterator[None]:
    """bf16 autocast on CUDA when enabled; a no-op on CPU, where bf16 matmuls are slow and imprecise."""
    if enabled and device.type == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            yield
    else:
        yield
