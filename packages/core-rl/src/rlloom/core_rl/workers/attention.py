"""Which attention kernel the trained models run, and what a packed (padding-free) forward hands it.

`model.attn_implementation: auto` picks flash-attention 2 where it can run (the flash-attn package, a CUDA device,
bf16 compute), else SDPA. Packed micro-batches are one `[1, nnz]` stream whose position ids restart per sequence.
What transformers 5.24 does with that stream depends on the kernel (read in `masking_utils` and
`modeling_flash_attention_utils`):

- flash_attention_2: `flash_attention_mask` returns no mask, and the varlen kernel runs on the sequence boundaries.
  We pass them (`cu_seq_lens_q/k`, `max_length_q/k`) so transformers does not re-derive them from the position ids
  in every layer (`_is_packed_sequence` and `prepare_fa_kwargs_from_position_ids`, two host syncs a layer).
- sdpa / eager: `find_packed_sequence_indices` detects the restarts and `sdpa_mask` / `eager_mask` build a dense
  block-diagonal `[1, 1, nnz, nnz]` mask (bool for sdpa, the compute dtype for eager), once per forward, and
  attention costs nnz^2 instead of the sum of squared lengths. We keep packing there (CPU runs and the tests need
  the packed path, and it still saves the padding's MLP work) and log the mask's size once, so a GPU run that could
  use varlen attention learns what it pays.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import torch
from torch import nn

from rlloom.core_rl.config.keys import ConfigError
from rlloom.core_rl.config.schema import ModelConfig

logger = logging.getLogger(__name__)

ATTN_CHOICES = ("auto", "sdpa", "flash_attention_2", "eager")
FLASH = "flash_attention_2"


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def resolve_attn_implementation(requested: str, device: torch.device, *, bf16_compute: bool) -> str:
    """The transformers `attn_implementation` for `model.attn_implementation` on `device`.

    auto: flash_attention_2 when flash-attn is installed, the device is a GPU and compute is bf16 (the kernel has
    no fp32 path), else sdpa. An explicit flash_attention_2 that cannot run is an error naming what is missing."""
    if requested == "auto":
        usable = device.type == "cuda" and bf16_compute and flash_attn_installed()
        return FLASH if usable else "sdpa"
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
    """Whether a packed stream reaches a varlen kernel (flash-attention 2/3 and their kernels-hub builds)."""
    name = attn_implementation_of(model)
    return name is not None and "flash" in name


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


_LOGGED_DENSE_MASK: set[str | None] = set()
"""Attention implementations whose dense packed mask was logged (once per process each)."""


def _log_dense_mask(attn_implementation: str | None, nnz: int, sum_sq: int) -> None:
    mib = dense_mask_bytes(attn_implementation, nnz) / 2**20
    logger.warning(
        "padding_free with attention %s: transformers builds a dense block-diagonal [%d, %d] mask for each packed "
        "forward (%.3g MiB here) and attention costs %d score entries per head instead of %d (the sum of squared "
        "lengths); model.attn_implementation=flash_attention_2 (or auto with flash-attn on a GPU) runs the varlen "
        "kernel instead",
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
    "attn_implementation_of",
    "dense_mask_bytes",
    "flash_attn_installed",
    "model_attn_implementation",
    "packed_attention_kwargs",
    "resolve_attn_implementation",
    "uses_varlen_kernel",
]
