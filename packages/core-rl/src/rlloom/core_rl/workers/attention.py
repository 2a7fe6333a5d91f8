"""Which attention kernel the trained models run, and what a packed (padding-free) forward hands it.

`model.attn_implementation: auto` picks flash-attention 2 where it can run (the flash-attn package, a CUDA device,
bf16 compute), else `sdpa_varlen`, rlloom's own entry in transformers' `AttentionInterface`. Packed micro-batches
are one `[1, nnz]` stream whose position ids restart per sequence; the forwards pass its boundaries
(`cu_seq_lens_q/k`, `max_length_q/k`, the flash-attention kwargs transformers threads through every layer).

- flash_attention_2: `flash_attention_mask` returns no mask and the varlen kernel runs on those boundaries, which
  we pass so transformers does not re-derive them from the position ids in every layer.
- sdpa_varlen: a padded forward is transformers' `sdpa` unchanged (same mask function, same kernel). A packed
  forward (`packed_stream`) builds no mask at all and attends within each sequence through a varlen path torch
  itself provides: `torch.nn.attention.varlen.varlen_attn` (flash-attention in ATen, no flash-attn package) on a
  GPU in bf16/fp16, else causal SDPA on each sequence's slice (CPU, fp32, dropout). Memory stays O(nnz) and
  attention costs the sum of squared lengths.
- sdpa / eager chosen explicitly: transformers' `find_packed_sequence_indices` detects the restarts and
  `sdpa_mask` / `eager_mask` build a dense block-diagonal `[1, 1, nnz, nnz]` mask once per forward, and attention
  costs nnz^2 (1.5x slower than padding on an H100 at 16k tokens, docs/gpu_check_reports/2026-11-27-h100). We log
  the mask's size once.

Not FlexAttention: eager flex materialises the full score matrix and compiled flex recompiles per packed shape.
Not nested-jagged SDPA: torch 2.13 refuses `is_causal` for jagged queries ("No viable backend").
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import itertools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rlloom.core_rl.config.keys import ConfigError
from rlloom.core_rl.config.schema import ModelConfig

logger = logging.getLogger(__name__)

ATTN_CHOICES = ("auto", "sdpa", "flash_attention_2", "eager")
FLASH = "flash_attention_2"
VARLEN = "sdpa_varlen"
"""rlloom's attention implementation: transformers' sdpa for padded forwards, torch's varlen path for packed ones."""


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def resolve_attn_implementation(requested: str, device: torch.device, *, bf16_compute: bool) -> str:
    """The transformers `attn_implementation` for `model.attn_implementation` on `device`.

    auto: flash_attention_2 when flash-attn is installed, the device is a GPU and compute is bf16 (the kernel has
    no fp32 path), else sdpa_varlen (sdpa, with torch's varlen path for packed streams). An explicit
    flash_attention_2 that cannot run is an error naming what is missing."""
    if requested == "auto":
        usable = device.type == "cuda" and bf16_compute and flash_attn_installed()
        return FLASH if usable else VARLEN
    if requested == FLASH:
        missing = [
            reason
            for reason, ok in (
                ("the flash-attn package (pip install flash-attn --no-build-isolation)", flash_attn_installed()),
                (f"a CUDA device (this model loads on {device.type})", device.type == "cuda"),
                ("bf16 compute (set model.dtype=bfloat16; flash-attention has no fp32 kernel)", bf16_compute),
            )
            if not ok
        ]
        if missing:
            raise ConfigError(
                f"model.attn_implementation=flash_attention_2 needs {' and '.join(missing)}; set "
                "model.attn_implementation=auto (flash-attention where it can run, else sdpa) or sdpa"
            )
    return requested


def model_attn_implementation(cfg: ModelConfig, device: torch.device) -> str:
    """`resolve_attn_implementation` for the `model` section of a run loading onto `device`."""
    return resolve_attn_implementation(cfg.attn_implementation, device, bf16_compute=cfg.dtype == "bfloat16")


def attn_implementation_of(model: nn.Module) -> str | None:
    """The attention kernel a loaded HF model (or a LoRA / FSDP2 wrapper of one) runs."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None)


def uses_varlen_kernel(model: nn.Module) -> bool:
    """Whether a packed stream reaches a varlen path (flash-attention 2/3, their kernels-hub builds, sdpa_varlen)."""
    name = attn_implementation_of(model)
    return name is not None and ("flash" in name or name == VARLEN)


def packed_attention_kwargs(model: nn.Module, cu_seqlens: torch.Tensor, max_seqlen: int) -> dict[str, Any]:
    """Extra forward arguments for a packed stream: the sequence boundaries for a varlen kernel, else nothing (and,
    once per process, a log line with the dense mask transformers builds instead)."""
    if uses_varlen_kernel(model):
        cu = cu_seqlens.to(torch.int32)
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max_seqlen, "max_length_k": max_seqlen}
    name = attn_implementation_of(model)
    if name not in _LOGGED_DENSE_MASK:  # the sizes below cost a host sync: only for the one log line
        _LOGGED_DENSE_MASK.add(name)
        _log_dense_mask(name, int(cu_seqlens[-1]), _squared_lengths(cu_seqlens))
    return {}


def dense_mask_bytes(attn_implementation: str | None, nnz: int) -> int:
    """Bytes of the `[1, 1, nnz, nnz]` block-diagonal mask transformers builds for a packed stream (sdpa: bool;
    eager: an additive float32 mask, the widest case)."""
    return nnz * nnz * (1 if attn_implementation == "sdpa" else 4)


_PACKED_STREAM: ContextVar[bool] = ContextVar("rlloom_packed_stream", default=False)
"""Set while a packed forward builds its masks: sdpa_varlen's mask function then builds none."""


@contextmanager
def packed_stream() -> Iterator[None]:
    """Wrap the model call of a packed forward: under sdpa_varlen no `[nnz, nnz]` mask is built (the layers get
    the boundaries instead). Masks are built once per forward, outside checkpointed layers, so a recompute in
    backward needs no context. Other implementations ignore it."""
    token = _PACKED_STREAM.set(True)
    try:
        yield
    finally:
        _PACKED_STREAM.reset(token)


def sdpa_varlen_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """sdpa_varlen's mask function: `sdpa_mask` for padded forwards, nothing for a packed stream."""
    if _PACKED_STREAM.get():
        return None
    result: torch.Tensor | None = sdpa_mask(*args, **kwargs)
    return result


def sdpa_varlen_attention(  # noqa: PLR0917 - transformers calls attention functions positionally
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract (`[b, heads, t, dim]` in, `[b, t, heads, dim]` out). With the
    packed boundaries `cu_seq_lens_q` in kwargs: causal attention inside each sequence of the `[1, nnz]` stream
    (`varlen_causal_attention`); without them: transformers' `sdpa_attention_forward`, exactly."""
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        return sdpa_attention_forward(  # type: ignore[no-any-return]
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    if query.shape[0] != 1:
        raise ValueError(f"sdpa_varlen: a packed stream is one row, got a batch of {query.shape[0]}")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [nnz, heads, dim]
    max_len = int(kwargs.get("max_length_q") or int((cu_seqlens[1:] - cu_seqlens[:-1]).max()))
    out = varlen_causal_attention(q, k, v, cu_seqlens, max_len, scale=scaling, dropout=dropout)
    return out.unsqueeze(0), None


def varlen_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_len: int,
    *,
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Causal attention within each `[cu[i], cu[i+1])` span of `[nnz, heads, dim]` tensors (key/value heads may
    divide the query heads: GQA); `[nnz, heads, dim]` out. torch's `varlen_attn` on a GPU in half precision (the
    autocast dtype counts: it is a custom op autocast does not cast for us), else `per_sequence_attention`."""
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else q.dtype
    if q.is_cuda and dropout == 0.0 and dtype in (torch.float16, torch.bfloat16):
        call = torch_varlen_call(q.shape[1], k.shape[1], scale)
        if call is not None:
            return call(q.to(dtype), k.to(dtype), v.to(dtype), cu_seqlens.to(torch.int32), max_len)
    return per_sequence_attention(q, k, v, cu_seqlens, scale=scale, dropout=dropout)


def per_sequence_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Causal SDPA on each sequence's slice: the largest score matrix is one sequence's, never nnz x nnz. One host
    read of the boundaries per layer (free on a CPU; on a GPU only where `varlen_attn` cannot run)."""
    bounds = cu_seqlens.tolist()
    parts = []
    for start, end in itertools.pairwise(bounds):
        if end == start:
            continue
        qs, ks, vs = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=ks.shape[1] != qs.shape[1]
        )
        parts.append(out[0].transpose(0, 1))
    return torch.cat(parts) if parts else q.new_zeros(q.shape)


VarlenCall = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


@cache
def torch_varlen_call(heads: int, kv_heads: int, scale: float | None) -> VarlenCall | None:
    """A causal call of `torch.nn.attention.varlen.varlen_attn` fitted to this torch's signature (2.9 took
    `is_causal`, later ones `window_size=(-1, 0)`; `enable_gqa` is newer still, so older ones get the key/value
    heads repeated), or None when this torch has no usable varlen_attn."""
    try:
        varlen_attn = importlib.import_module("torch.nn.attention.varlen").varlen_attn
    except (ImportError, AttributeError):
        return None
    params = inspect.signature(varlen_attn).parameters
    options: dict[str, Any] = {}
    if "window_size" in params:
        options["window_size"] = (-1, 0)
    elif "is_causal" in params:
        options["is_causal"] = True
    else:
        return None
    if scale is not None:
        if "scale" not in params:
            return None
        options["scale"] = scale
    repeat = 1
    if kv_heads != heads:
        if "enable_gqa" in params:
            options["enable_gqa"] = True
        else:
            repeat = heads // kv_heads

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int) -> torch.Tensor:
        if repeat > 1:
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out: torch.Tensor = varlen_attn(q, k, v, cu, cu, max_len, max_len, **options)
        return out

    return call


def packed_attention_backend(model: nn.Module, device: torch.device, *, bf16_compute: bool) -> str:
    """In words, what a packed stream of `model` runs on `device`: for reports (bench/gpu_check.py)."""
    name = attn_implementation_of(model)
    if name is not None and "flash" in name:
        return f"{name} varlen (flash-attn)"
    if name != VARLEN:
        return f"{name} dense [nnz, nnz] mask"
    config = getattr(model, "config", None)
    heads = int(getattr(config, "num_attention_heads", 1))
    kv_heads = int(getattr(config, "num_key_value_heads", heads) or heads)
    if device.type == "cuda" and bf16_compute and torch_varlen_call(heads, kv_heads, None) is not None:
        return f"{VARLEN}: torch.nn.attention.varlen.varlen_attn"
    return f"{VARLEN}: causal sdpa per sequence"


def register_sdpa_varlen() -> str:
    """Make `sdpa_varlen` a transformers attention implementation (idempotent; done on import)."""
    AttentionInterface.register(VARLEN, sdpa_varlen_attention)
    AttentionMaskInterface.register(VARLEN, sdpa_varlen_mask)
    return VARLEN


register_sdpa_varlen()


_LOGGED_DENSE_MASK: set[str | None] = set()
"""Attention implementations whose dense packed mask was logged (once per process each)."""


def _log_dense_mask(attn_implementation: str | None, nnz: int, sum_sq: int) -> None:
    mib = dense_mask_bytes(attn_implementation, nnz) / 2**20
    logger.warning(
        "padding_free with attention %s: transformers builds a dense block-diagonal [%d, %d] mask for each packed "
        "forward (%.3g MiB here) and attention costs %d score entries per head instead of %d (the sum of squared "
        "lengths); model.attn_implementation=auto runs a varlen path instead (flash-attn where installed, else "
        "torch's varlen_attn / per-sequence sdpa)",
        attn_implementation,
        nnz,
        nnz,
        mib,
        nnz * nnz,
        sum_sq,
    )


def _squared_lengths(cu_seqlens: torch.Tensor) -> int:
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return int((lengths * lengths).sum())


__all__ = [
    "ATTN_CHOICES",
    "VARLEN",
    "attn_implementation_of",
    "dense_mask_bytes",
    "flash_attn_installed",
    "model_attn_implementation",
    "packed_attention_backend",
    "packed_attention_kwargs",
    "packed_stream",
    "per_sequence_attention",
    "register_sdpa_varlen",
    "resolve_attn_implementation",
    "sdpa_varlen_attention",
    "uses_varlen_kernel",
    "varlen_causal_attention",
]
