"""The batched decode loop behind `HFEngine`: one prefill, then one forward per new token with a KV cache.

We run our own loop rather than `model.generate` because a rollout batch mixes per-request sampling
parameters, seeds, stop strings and token budgets, needs the sampled tokens' logprobs, and should hand each
request back the moment its samples finish (agents are waiting on them). Each unique prompt is prefilled once
and its cache rows repeated for the request's n samples; rows that finish are dropped from the batch (and the
KV cache) so long stragglers do not drag a full batch of dead rows along. Left padding plus explicit position
ids keep padded rows numerically equal to unpadded ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from rlloom.core_rl.generation import FinishReason, SamplingParams
from rlloom.rollout.sampling import RowSampling, sample_next
from rlloom.rollout.stopping import StopStringWatcher


@dataclass(slots=True)
class SampleRow:
    """One sample being generated: its prompt, knobs, and what has been sampled so far."""

    request_index: int
    sample_index: int
    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    watcher: StopStringWatcher | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    first_token_s: float = 0.0
    done_s: float = 0.0


@dataclass(slots=True)
class DecodeSettings:
    """Engine-wide knobs of the loop (not per request)."""

    pad_token_id: int
    max_positions: int  # the model's context length; a row that reaches it ends with 'length'
    compact_every: int = 1  # drop finished rows once at least this many have piled up
    forward_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. multimodal tensors for the prefill
    explicit_positions: bool = True  # False lets the model build positions (Qwen2-VL's 3-D rope)


def left_pad(prompts: Sequence[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask, padded on the left so every prompt ends at the last column."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def _row_finish(row: SampleRow, token: int, settings: DecodeSettings) -> None:
    """Decide whether `token` (just appended) ends the row, and why."""
    if token in row.stop_ids:
        row.finish_reason, row.stop_reason = "stop", token
    elif row.watcher is not None and row.watcher.push(token):
        row.finish_reason = "stop"
    elif len(row.token_ids) >= min(row.params.max_tokens, settings.max_positions - len(row.prompt_ids)):
        row.finish_reason = "length"


@torch.inference_mode()
def decode(
    model: torch.nn.Module,
    rows: list[SampleRow],
    settings: DecodeSettings,
    on_finish: Callable[[SampleRow], None] | None = None,
) -> None:
    """Generate every row to completion in one batch, filling `token_ids`, `logprobs` and `finish_reason`."""
    device = next(model.parameters()).device
    start = time.perf_counter()
    # Prefill each distinct request once; its n sample rows share that cache row.
    request_order = list(dict.fromkeys(r.request_index for r in rows))
    first_row = {r.request_index: r for r in reversed(rows)}
    ids, mask = left_pad([first_row[q].prompt_ids for q in request_order], settings.pad_token_id, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=getattr(model, "config", None))
    kwargs: dict[str, Any] = dict(settings.forward_kwargs)
    if settings.explicit_positions:
        kwargs["position_ids"] = positions
    out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1, **kwargs)
    logits = out.logits[:, -1, :]
    slot = {q: i for i, q in enumerate(request_order)}
    expand = torch.tensor([slot[r.request_index] for r in rows], device=device)
    if len(rows) != len(request_order):
        cache.batch_select_indices(expand)
        logits, mask, positions = logits[expand], mask[expand], positions[expand]
    last_pos = positions[:, -1:]

    sampling = RowSampling.build([r.params for r in rows], [r.sample_index for r in rows], logits.shape[-1], device)
    want_logprobs = any(r.params.logprobs for r in rows)
    active = list(rows)  # rows in the batch, aligned with the tensors (some may be finished, awaiting removal)
    while True:
        tokens, logprobs = sample_next(logits, sampling, want_logprobs)
        token_list = tokens.tolist()
        logprob_list = logprobs.tolist() if logprobs is not None else None
        now = time.perf_counter() - start
        finished_in_batch = 0
        for j, row in enumerate(active):
            if row.finish_reason is not None:
                finished_in_batch += 1
                continue
            row.token_ids.append(token_list[j])
            if logprob_list is not None and row.params.logprobs:
                row.logprobs.append(logprob_list[j])
            if len(row.token_ids) == 1:
                row.first_token_s = now
            _row_finish(row, token_list[j], settings)
            if row.finish_reason is not None:
                finished_in_batch += 1
                row.done_s = now
                if on_finish is not None:
                    on_finish(row)
        if finished_in_batch == len(active):
            return
        if finished_in_batch >= settings.compact_every:
            keep_list = [j for j, r in enumerate(active) if r.finish_reason is None]
            keep = torch.tensor(keep_list, device=device)
            cache.batch_select_indices(keep)
            mask, last_pos, tokens = mask[keep], last_pos[keep], tokens[keep]
            sampling = sampling.select(keep, keep_list)
            active = [active[j] for j in keep_list]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        last_pos = last_pos + 1
        step_kwargs: dict[str, Any] = {"position_ids": last_pos} if settings.explicit_positions else {}
        out = model(
            input_ids=tokens.unsqueeze(-1),
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
            **step_kwargs,
        )
        logits = out.logits[:, -1, :]
