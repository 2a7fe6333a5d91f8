"""Forward passes over a (micro-)batch that return per-response-token quantities.

The logit at position t predicts token t+1, so response token j (column P + j) is scored by the logits at column
P + j − 1; `[:, P-1:-1]` in the padded layout. The packed (padding-free) path runs the real tokens as one stream
with restarting position ids and maps results back to the padded layout; both paths give the same numbers (tested).
Temperature divides the logits so training log-probs match the distribution the engine sampled from. Only the
positions that score a response token go through the LM head (transformers' `logits_to_keep`): the prompt's
logits, `[b, P, vocab]` and as many again in backward, were computed only to be sliced away. With `scored`, only
the hidden states that score those response tokens do (`head.lm_head_on`): the policy update reads the loss-mask-1
tokens only, and in an agent conversation the retrieved passages and tool outputs are most of the response.

Rows whose `multimodal` dict holds `position_ids` (the prompt's (3, P) M-RoPE positions, as a vision-language
rollout carries them) are forwarded one row per forward with their own positions and the dict's other entries
(`pixel_values`, `image_grid_thw`, ...) as extra keyword arguments, because image inputs are per row; the
response continues the positions exactly as the engine's decode did (`continue_rope_positions`). Text-only rows
take the batched (padded or packed) path as before.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import DynamicLayer

from rlloom.core_rl.algorithms import entropy_from_logits, logprobs_from_logits
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.packing import pack, unpack
from rlloom.core_rl.workers.attention import packed_attention_kwargs, packed_stream
from rlloom.core_rl.workers.head import has_output_head, lm_head_on, scoring_positions

CHUNK_ELEMENTS = 256 * 32_768
"""Logit elements per chunk of the log-prob/entropy reductions (32 MiB in float32): chunking by elements rather
than rows keeps a 150k vocabulary's temporaries small and lets a small vocabulary run in one chunk, where
splitting would only add per-op overhead."""


def _chunk_rows(vocab: int) -> int:
    return max(256, CHUNK_ELEMENTS // max(vocab, 1))


ROPE_POSITIONS_KEY = "position_ids"
"""The key of `Trajectory.multimodal` that holds a prompt's explicit (3, P) M-RoPE positions."""


def continue_rope_positions(prompt_positions: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """(3, P) prompt M-RoPE positions -> (3, P + new_tokens): each new token one past the largest so far.

    The engine's rule for generated tokens (an image's height/width rows can outrun the text row, so the next
    token starts past the maximum over all three rows, which is where transformers' `rope_deltas` puts it).
    """
    start = int(prompt_positions.max()) + 1 if prompt_positions.numel() else 0
    tail = torch.arange(start, start + new_tokens, dtype=prompt_positions.dtype, device=prompt_positions.device)
    return torch.cat([prompt_positions, tail.expand(prompt_positions.shape[0], -1)], dim=-1)


def rope_rows(batch: TrajectoryBatch) -> list[int]:
    """Rows whose `multimodal` dict holds prompt `position_ids`: each gets a forward of its own."""
    extras = batch.non_tensors.get("multimodal") or []
    return [i for i, mm in enumerate(extras) if mm and ROPE_POSITIONS_KEY in mm]


def keep_logits(model: nn.Module, keep: int | torch.Tensor) -> dict[str, int | torch.Tensor]:
    """`{"logits_to_keep": keep}` when the model's forward takes it (transformers' causal LMs and VLMs do, also
    under a LoRA wrapper), else no argument; callers slice the logits so both cases give the same columns."""
    return {"logits_to_keep": keep} if "logits_to_keep" in _forward_parameters(model) else {}


def cache_argument(model: nn.Module) -> str:
    """The name of the forward's key/value cache argument (and output field): `cache` from transformers 5.24,
    `past_key_values` before (5.24 still takes it, with a deprecation warning)."""
    return "cache" if "cache" in _forward_parameters(model) else "past_key_values"


_FORWARD_PARAMETERS: dict[type[nn.Module], frozenset[str]] = {}


def _forward_parameters(model: nn.Module) -> frozenset[str]:
    """The forward's parameter names, asked once per model class, not on every micro-batch forward."""
    unwrap = getattr(model, "get_base_model", None)  # peft's LoRA wrapper forwards **kwargs to the base model
    model_class = type(unwrap() if callable(unwrap) else model)
    if model_class not in _FORWARD_PARAMETERS:
        _FORWARD_PARAMETERS[model_class] = frozenset(inspect.signature(model_class.forward).parameters)
    return _FORWARD_PARAMETERS[model_class]


def response_logprobs(
    model: nn.Module,
    batch: TrajectoryBatch,
    *,
    temperature: float = 1.0,
    packed: bool = False,
    entropy: bool = False,
    share_prompts: bool = False,
    scored: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs `[b, R]`, entropies `[b, R]` or None) of the response tokens; 0 on padding. `share_prompts`:
    rows with the same prompt forward it once (padded text rows; see `shared_prompt_rows`). `scored` (`[b, R]`
    bool, e.g. the loss mask): only those tokens are wanted, so only their scoring hidden states go through the LM
    head (text rows of a model with an output-embeddings module); the other tokens come back 0, as padding does."""
    own = rope_rows(batch)
    scored_rows = scored
    if scored is not None and not has_output_head(model):
        scored_rows = None  # no head module to hook: the full logits, masked below
    elif scored is not None and not bool((batch.response_attention_mask.bool() & ~scored.bool()).any()):
        scored_rows = None  # every real response token is wanted (single-turn rows): nothing to skip
    kwargs: dict[str, Any] = {"temperature": temperature, "packed": packed, "entropy": entropy}
    kwargs |= {"share_prompts": share_prompts, "scored": scored_rows}
    if not own:
        logprobs, ent = _batched_logprobs(model, batch, **kwargs)
    else:
        text = sorted(set(range(batch.batch_size)) - set(own))
        parts: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        if text:
            sub = batch.select(text)
            kwargs["scored"] = None if scored_rows is None else scored_rows[text]
            parts.append(_batched_logprobs(model, sub, **kwargs))
        parts.extend(_rope_row_logprobs(model, batch, i, temperature=temperature, entropy=entropy) for i in own)
        order = torch.argsort(torch.tensor(text + own)).to(batch["input_ids"].device)
        logprobs = torch.cat([lp for lp, _ in parts])[order]
        ent = torch.cat([e for _, e in parts if e is not None])[order] if entropy else None
    if scored is not None:  # rows the head could not be restricted on: the same zeros on the unwanted tokens
        wanted = scored.bool()
        logprobs = torch.where(wanted, logprobs, torch.zeros_like(logprobs))
        ent = None if ent is None else torch.where(wanted, ent, torch.zeros_like(ent))
    return logprobs, ent


def _rope_row_forward(
    model: nn.Module, batch: TrajectoryBatch, row: int, **extra: Any
) -> tuple[Any, torch.Tensor, int, int]:
    """Forward one row alone over its real tokens with its own image inputs and continued M-RoPE positions;
    returns (model output, the row's token ids, prompt length, response length). `extra` goes to the forward."""
    width_p = batch.prompt_width
    mask = batch["attention_mask"][row].bool()
    ids = batch["input_ids"][row][mask]
    n_p, n_r = int(mask[:width_p].sum()), int(mask[width_p:].sum())
    inputs: dict[str, Any] = dict(batch.non_tensors["multimodal"][row])
    positions = _prompt_rope_positions(inputs.pop(ROPE_POSITIONS_KEY), n_p, row)
    positions = continue_rope_positions(positions.to(ids.device), n_r)
    inputs = {k: v.to(ids.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    out = model(
        input_ids=ids[None],
        attention_mask=torch.ones_like(ids)[None],
        position_ids=positions[:, None],
        use_cache=False,
        **inputs,
        **extra,
    )
    return out, ids, n_p, n_r


def _rope_row_logprobs(
    model: nn.Module, batch: TrajectoryBatch, row: int, *, temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`[1, R]` log-probs (and entropies) of one row, forwarded alone (`_rope_row_forward`)."""
    n_r = int(batch.response_attention_mask[row].sum())
    keep = n_r + 1  # the last prompt token and every response token but the last score the response
    out, ids, n_p, n_r = _rope_row_forward(model, batch, row, **keep_logits(model, keep))
    logits = out.logits[0, -keep:-1] / temperature
    rows = _chunk_rows(logits.shape[-1])
    pad = (0, batch.response_width - n_r)
    logprobs = nn.functional.pad(logprobs_from_logits(logits, ids[n_p:], chunk_size=rows), pad)[None]
    ent = nn.functional.pad(entropy_from_logits(logits, chunk_size=rows), pad)[None] if entropy else None
    return logprobs, ent


def _prompt_rope_positions(positions: torch.Tensor, prompt_len: int, row: int) -> torch.Tensor:
    """A prompt's (3, P) positions from (3, P), (3, 1, P) or transformers' packed (4, ..., P) layout."""
    positions = torch.as_tensor(positions)
    if positions.shape[0] == 4:  # transformers' packed layout: a text row, then the three M-RoPE rows
        positions = positions[1:]
    if positions.shape[0] != 3 or positions.numel() != 3 * prompt_len:
        raise ValueError(
            f"row {row}: multimodal['position_ids'] has shape {tuple(positions.shape)} but the prompt has "
            f"{prompt_len} tokens; give the prompt's (3, len(prompt_ids)) M-RoPE positions (VisionInputs.position_ids)"
        )
    return positions.reshape(3, prompt_len).long()


def shared_prompt_rows(batch: TrajectoryBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(the first row of each distinct prompt, every row's index into those) when some rows share a prompt, as
    GRPO's n samples of one prompt do; None when every prompt is distinct. Prompts are compared with their padding
    and positions, so rows that share one would give it the same keys and values."""
    width_p = batch.prompt_width
    if batch.batch_size < 2 or width_p == 0 or batch.response_width == 0:
        return None
    # On the CPU: a GPU's row-wise unique is a merge sort that took 17 ms on an H100 for 16 rows of 909 prompt
    # tokens, a quarter of the forward it was meant to shorten (bench/gpu_check.py, shared_prompt).
    key = torch.cat([batch[name][:, :width_p] for name in ("input_ids", "attention_mask", "position_ids")], dim=1)
    distinct, inverse = torch.unique(key.cpu(), dim=0, return_inverse=True)  # one copy to the host, not three
    if distinct.shape[0] == batch.batch_size:
        return None
    rows = torch.arange(batch.batch_size)
    first = torch.full((distinct.shape[0],), batch.batch_size, dtype=rows.dtype)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    device = batch["input_ids"].device
    return first.to(device), inverse.to(device)


def _checkpointed(model: nn.Module) -> bool:
    """Activation checkpointing reruns each layer in backward, which would append the keys and values of the
    response forward to the shared cache a second time; such models take the plain forward."""
    return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


def _shared_prompt_logits(
    model: nn.Module, batch: TrajectoryBatch, first: torch.Tensor, inverse: torch.Tensor
) -> torch.Tensor | None:
    """`[b, R, V]` logits scoring each response token, forwarding each distinct prompt once (Prefix Grouper, Liu
    et al. 2025): the prompt's keys and values are computed for its first row and indexed out to every row that
    shares it, then the responses attend to them. The same numbers as the full forward; gradients reach the shared
    prompt activations summed over its rows, as the full forward's would. None when the model's cache is not a
    plain per-layer key/value store (sliding windows, recurrent layers): the caller then runs the full forward."""
    out = _shared_prompt_forward(model, batch, first, inverse)
    if out is None:
        return None
    prompt_last, response = out
    # The prompt's last column scores the first response token; response column j scores token j + 1.
    return torch.cat([prompt_last[:, None], response[:, :-1]], dim=1)


def _shared_prompt_forward(
    model: nn.Module,
    batch: TrajectoryBatch,
    first: torch.Tensor,
    inverse: torch.Tensor,
    head_columns: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(each row's prompt-last-column logits `[b, V]`, the response forward's logits): each distinct prompt forwarded
    once, its cache indexed out to the rows that share it. With `head_columns` (`[b, R]` bool) the response
    forward's LM head sees only those columns (`lm_head_on`: logits `[1, n, V]`). None when the model's cache is
    not a plain per-layer key/value store."""
    width_p = batch.prompt_width
    ids, mask, positions = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    prompt = model(
        input_ids=ids[first, :width_p],
        attention_mask=mask[first, :width_p],
        position_ids=positions[first, :width_p],
        use_cache=True,
        **keep_logits(model, 1),
    )
    name = cache_argument(model)
    cache = getattr(prompt, name, None)
    if cache is None or not all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None])):
        return None
    cache.reorder_cache(inverse)  # index_select: differentiable, so the rows' gradients sum into the prompt's
    restrict = lm_head_on(model, head_columns) if head_columns is not None else contextlib.nullcontext()
    with restrict:
        response = model(
            input_ids=ids[:, width_p:],
            attention_mask=mask,
            position_ids=positions[:, width_p:],
            use_cache=True,
            **{name: cache},
        )
    return prompt.logits[inverse, -1], response.logits


def _batched_logprobs(
    model: nn.Module,
    batch: TrajectoryBatch,
    *,
    temperature: float,
    packed: bool,
    entropy: bool,
    share_prompts: bool = False,
    scored: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Text-only rows in one padded or packed forward; padded, with `share_prompts`, each distinct prompt is
    forwarded once (`shared_prompt_rows`); with `scored`, the LM head runs on the wanted tokens only."""
    if scored is not None:
        parts = scored_logits(model, batch, scored, packed=packed, share_prompts=share_prompts)
        return _spread_parts(batch, parts, temperature=temperature, entropy=entropy)
    width_p = batch.prompt_width
    if packed:
        seqs = pack(batch["input_ids"], batch["attention_mask"])
        # Stream positions whose logits score a response token: padded columns P-1 .. L-2 of each row.
        column = seqs.indices % seqs.padded_shape[1]
        scoring = ((column >= width_p - 1) & (column < seqs.padded_shape[1] - 1)).nonzero().squeeze(-1)
        kept = keep_logits(model, scoring)
        varlen = packed_attention_kwargs(model, seqs.cu_seqlens, seqs.max_seqlen)
        with packed_stream():  # sdpa_varlen: no [nnz, nnz] mask, the layers attend within the boundaries
            out = model(input_ids=seqs.input_ids, position_ids=seqs.position_ids, use_cache=False, **kept, **varlen)
        logits = (out.logits[0] if kept else out.logits[0][scoring]) / temperature
        # Next token in the stream; at a sequence's last token this is the next sequence's first token, a junk
        # value that lands on the response column after the last real token, which is padding.
        next_ids = torch.roll(seqs.input_ids[0], -1)[scoring]
        rows = _chunk_rows(logits.shape[-1])
        logprobs = unpack(logprobs_from_logits(logits, next_ids, chunk_size=rows), seqs, positions=scoring)
        logprobs = logprobs[:, width_p - 1 : -1]
        ent = None
        if entropy:
            ent = unpack(entropy_from_logits(logits, chunk_size=rows), seqs, positions=scoring)[:, width_p - 1 : -1]
    else:
        groups = shared_prompt_rows(batch) if share_prompts and not _checkpointed(model) else None
        logits = _shared_prompt_logits(model, batch, *groups) if groups is not None else None
        if logits is None:
            keep = batch.response_width + 1  # columns P-1 .. L-1; the last one scores nothing
            out = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"],
                use_cache=False,
                **keep_logits(model, keep),
            )
            logits = out.logits[:, -keep:-1]
        logits = logits / temperature
        rows = _chunk_rows(logits.shape[-1])
        logprobs = logprobs_from_logits(logits, batch.responses, chunk_size=rows)
        ent = entropy_from_logits(logits, chunk_size=rows) if entropy else None
    mask = batch.response_attention_mask.bool()
    logprobs = torch.where(mask, logprobs, torch.zeros_like(logprobs))
    if ent is not None:
        ent = torch.where(mask, ent, torch.zeros_like(ent))
    return logprobs, ent


ScoredLogits = list[tuple[torch.Tensor, torch.Tensor]]
"""(wanted `[b, R]` bool, their logits `[n, vocab]` in row-major order) parts that together cover a batch's wanted
response tokens once each."""


def scored_logits(
    model: nn.Module, batch: TrajectoryBatch, scored: torch.Tensor, *, packed: bool, share_prompts: bool
) -> ScoredLogits:
    """Logits of the `scored` response tokens only, the LM head run on just their scoring hidden states."""
    wanted = scored.bool() & batch.response_attention_mask.bool()
    positions = scoring_positions(batch, wanted)
    if packed:
        seqs = pack(batch["input_ids"], batch["attention_mask"])
        stream = positions.flatten()[seqs.indices].unsqueeze(0)  # padded columns -> stream order, same order
        varlen = packed_attention_kwargs(model, seqs.cu_seqlens, seqs.max_seqlen)
        with lm_head_on(model, stream), packed_stream():
            out = model(input_ids=seqs.input_ids, position_ids=seqs.position_ids, use_cache=False, **varlen)
        return [(wanted, out.logits[0])]
    groups = shared_prompt_rows(batch) if share_prompts and not _checkpointed(model) else None
    if groups is not None:
        parts = _shared_prompt_scored_logits(model, batch, wanted, *groups)
        if parts is not None:
            return parts
    with lm_head_on(model, positions):
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            use_cache=False,
        )
    return [(wanted, out.logits[0])]


def _shared_prompt_scored_logits(
    model: nn.Module, batch: TrajectoryBatch, wanted: torch.Tensor, first: torch.Tensor, inverse: torch.Tensor
) -> ScoredLogits | None:
    """`_shared_prompt_logits` with the head restricted: the prompt's last column scores response token 0 (one
    logit row per distinct prompt, indexed out to the rows that want token 0), and the response forward's head
    sees only the columns j that score a wanted token j + 1. None where the cache is not a plain key/value store."""
    first_token = torch.zeros_like(wanted)
    first_token[:, 0] = wanted[:, 0]
    later = wanted & ~first_token
    head_columns = torch.zeros_like(wanted)
    head_columns[:, :-1] = later[:, 1:]  # response column j scores token j + 1
    out = _shared_prompt_forward(model, batch, first, inverse, head_columns)
    if out is None:
        return None
    prompt_last, response = out
    return [(first_token, prompt_last[wanted[:, 0]]), (later, response[0])]


def _spread_parts(
    batch: TrajectoryBatch, parts: ScoredLogits, *, temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`[b, R]` log-probs (and entropies) from the wanted tokens' logits: each part's values written to its
    wanted positions (differentiably), 0 elsewhere."""
    logprobs: torch.Tensor | None = None
    ent: torch.Tensor | None = None
    for wanted, raw in parts:
        logits = raw / temperature
        rows = _chunk_rows(logits.shape[-1])
        part_lp = _spread(logprobs_from_logits(logits, batch.responses[wanted], chunk_size=rows), wanted)
        logprobs = part_lp if logprobs is None else logprobs + part_lp
        if entropy:
            part_ent = _spread(entropy_from_logits(logits, chunk_size=rows), wanted)
            ent = part_ent if ent is None else ent + part_ent
    assert logprobs is not None  # scored_logits returns at least one part
    return logprobs, ent


def _spread(values: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """`values` (one per wanted position, row-major) at the wanted positions of a `[b, R]` tensor of zeros."""
    return values.new_zeros(wanted.shape).masked_scatter(wanted, values)


def response_hidden_states(backbone: nn.Module, batch: TrajectoryBatch, *, packed: bool = False) -> torch.Tensor:
    """Last hidden states `[b, R, H]` at the positions that precede each response token (the critic's states).
    Vision-language rows (`rope_rows`) are forwarded one by one with their images, as for the log-probs."""
    own = rope_rows(batch)
    if not own:
        return _batched_hidden_states(backbone, batch, packed=packed)
    text = sorted(set(range(batch.batch_size)) - set(own))
    parts = [_batched_hidden_states(backbone, batch.select(text), packed=packed)] if text else []
    for row in own:
        out, _, n_p, n_r = _rope_row_forward(backbone, batch, row)
        states = out.last_hidden_state[0, n_p - 1 : n_p - 1 + n_r]
        parts.append(nn.functional.pad(states, (0, 0, 0, batch.response_width - n_r))[None])
    order = torch.argsort(torch.tensor(text + own)).to(batch["input_ids"].device)
    return torch.cat(parts)[order]


def _batched_hidden_states(backbone: nn.Module, batch: TrajectoryBatch, *, packed: bool) -> torch.Tensor:
    width_p = batch.prompt_width
    if packed:
        seqs = pack(batch["input_ids"], batch["attention_mask"])
        varlen = packed_attention_kwargs(backbone, seqs.cu_seqlens, seqs.max_seqlen)
        with packed_stream():
            hidden = backbone(input_ids=seqs.input_ids, position_ids=seqs.position_ids, use_cache=False, **varlen)
        return unpack(hidden.last_hidden_state[0], seqs)[:, width_p - 1 : -1]
    hidden = backbone(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    )
    return hidden.last_hidden_state[:, width_p - 1 : -1]
