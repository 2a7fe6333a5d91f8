"""Mixed precision: the dtype that holds the trained parameters (and so their gradients and AdamW state) and the
dtype the forwards and backwards compute in.

A parameter stored in bf16 keeps an AdamW update only when it moves the value by half a bf16 step (2^-9 of the
value) or more; at lr 1e-6 most updates are smaller and vanish. So, as veRL does, trained parameters are fp32
master weights by default and `model.dtype` is the compute dtype: in-process through `torch.autocast` (on every
device that has a bf16 autocast, CPU included, so a CPU run has the numerics of a GPU run), on FSDP2 ranks
through `MixedPrecisionPolicy` (bf16 all-gathers and compute, gradients reduced in fp32 onto fp32 shards).
`model.param_dtype: bfloat16` keeps pure bf16 parameters for those who want the memory and accept the loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from rlloom.core_rl.config.schema import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    """params: dtype of trained parameters, their gradients and optimizer state; compute: dtype of the matmuls."""

    params: torch.dtype
    compute: torch.dtype

    @property
    def mixed(self) -> bool:
        """Whether parameters are held in a wider dtype than the one forwards compute in."""
        return self.params != self.compute

    @property
    def bf16_compute(self) -> bool:
        return self.compute == torch.bfloat16


def model_precision(model_cfg: ModelConfig) -> Precision:
    """The run's precision from its `model` section: `dtype` (compute) and `param_dtype` (storage of what is
    trained; the config refuses parameters narrower than the compute dtype)."""
    return Precision(params=DTYPES[model_cfg.param_dtype], compute=DTYPES[model_cfg.dtype])


def load_dtype(model_cfg: ModelConfig, *, trained: bool) -> torch.dtype:
    """The dtype to load weights in: trained ones in the parameter dtype; frozen ones (a reference, an engine's
    copy, LoRA's base model) in the compute dtype, since no optimizer step ever rounds them."""
    precision = model_precision(model_cfg)
    return precision.params if trained else precision.compute


@contextlib.contextmanager
def compute_autocast(device: torch.device, bf16: bool) -> Iterator[None]:
    """bf16 autocast around a forward (and its backward) when `bf16`, on any device that supports it (CPU and
    CUDA do); matmuls then run in bf16 while fp32 parameters, their gradients and the loss reductions that autocast
    keeps in fp32 stay fp32. A no-op for fp32 compute."""
    if bf16 and torch.amp.is_autocast_available(device.type):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            yield
    else:
        yield


def fsdp_mixed_precision(precision: Precision) -> Any:
    """FSDP2's `MixedPrecisionPolicy` for `precision` (parameters gathered and computed in the compute dtype,
    gradients reduce-scattered in fp32), or None when parameters are already in the compute dtype."""
    if not precision.mixed:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=precision.compute, reduce_dtype=torch.float32)


__all__ = ["DTYPES", "Precision", "compute_autocast", "fsdp_mixed_precision", "load_dtype", "model_precision"]
