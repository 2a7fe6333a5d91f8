"""The KV cache vLLM gets on a CPU host: sized from what the host has free and what the model needs, never from
vLLM's default, a fraction of the host's total RAM.

On CPU, vLLM 0.32 reads `gpu_memory_utilization` as the share of *total* host memory to reserve and refuses to
start when that much is not free: 0.5 of a 24 GiB host is 12 GiB, more than is free beside a trainer and other
work, so `search-agent train --engine vllm` died at start. An explicit `kv_cache_memory_bytes` skips that check
(and, with eager execution, vLLM's warm-up pass too). The size here is: the host's available memory (the cgroup's
limit too, where lower) minus what this run needs besides the cache (vLLM's copy of the weights, the trainer's
fp32 weights, gradients and AdamW moments at 16 bytes a parameter, and a fixed runtime allowance), halved so
other work keeps room, then capped at what `max_num_seqs` full contexts can use and at `CPU_KV_CACHE_CAP`; never
below one full context. `VLLM_CPU_KVCACHE_SPACE` (GiB), when set, wins: vLLM reads it itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1 << 30
CPU_KV_CACHE_CAP = 4 * GIB
"""Enough for about 180k tokens of SmolLM2-135M (22.5 KiB a token in bf16); more only slows the start."""
RUNTIME_BYTES = 3 * GIB // 2
"""vLLM's and torch's own resident memory on CPU besides the weights (about 1.2 GiB measured, rounded up)."""
TRAINER_BYTES_PER_PARAM = 16
"""The trainer's fp32 weights, gradients and AdamW's two moments."""
DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's default `max_num_seqs`."""


@dataclass(frozen=True, slots=True)
class KVCachePlan:
    """How many bytes the KV cache gets, and the one line saying why (logged once at the engine's start)."""

    kv_cache_bytes: int | None  # None: VLLM_CPU_KVCACHE_SPACE is set and vLLM reads it
    reason: str


def available_memory_bytes() -> int:
    """Free host memory: /proc/meminfo's MemAvailable, or the cgroup v2 limit minus its usage where that is lower."""
    available = _meminfo_available()
    limit, usage = _cgroup_value("memory.max"), _cgroup_value("memory.current")
    if limit is not None and usage is not None:
        available = min(available, max(0, limit - usage))
    return available


def _meminfo_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable line")  # pragma: no cover - every Linux since 3.14


def _cgroup_value(name: str) -> int | None:
    try:
        text = (Path("/sys/fs/cgroup") / name).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


@dataclass(frozen=True, slots=True)
class ModelMemory:
    """What a model needs: its weights as stored, parameters, and KV-cache bytes per token."""

    weight_bytes: int
    parameters: int
    kv_bytes_per_token: int
    context: int

    @classmethod
    def from_folder(cls, model: str, *, dtype: str = "auto", max_model_len: int | None = None) -> ModelMemory:
        """Read a local model folder's config.json and weight files (a hub name reads only the config)."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model)
        text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
        stored = str(getattr(text, "dtype", None) or getattr(text, "torch_dtype", None) or "float32")
        stored_bytes = 4 if "float32" in stored else 2
        run_bytes = 4 if dtype in ("float32", "float") else 2  # vLLM's "auto" runs an fp32 checkpoint in bf16
        folder = Path(model)
        files = [*folder.glob("*.safetensors"), *folder.glob("*.bin")] if folder.is_dir() else []
        weight_bytes = sum(f.stat().st_size for f in files)
        heads = int(text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or int(text.hidden_size) // heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        per_token = 2 * int(text.num_hidden_layers) * kv_heads * head_dim * run_bytes
        context = max_model_len or int(getattr(text, "max_position_embeddings", 0) or 2048)
        return cls(weight_bytes, weight_bytes // stored_bytes, per_token, context)


def plan_cpu_kv_cache(
    need: ModelMemory,
    *,
    available: int,
    max_num_seqs: int | None = None,
    trainer: bool = True,
    env: dict[str, str] | Any = os.environ,
) -> KVCachePlan:
    """The KV cache for `need` on a host with `available` bytes free (see the module docstring for the rule)."""
    if env.get("VLLM_CPU_KVCACHE_SPACE", "") != "":
        return KVCachePlan(None, f"KV cache {env['VLLM_CPU_KVCACHE_SPACE']} GiB from VLLM_CPU_KVCACHE_SPACE")
    reserve = need.weight_bytes + RUNTIME_BYTES + (TRAINER_BYTES_PER_PARAM * need.parameters if trainer else 0)
    one_context = need.kv_bytes_per_token * need.context
    useful = one_context * (max_num_seqs or DEFAULT_MAX_NUM_SEQS)
    size = max(one_context, min(CPU_KV_CACHE_CAP, useful, (available - reserve) // 2))
    if size > available - need.weight_bytes - RUNTIME_BYTES:
        raise ValueError(
            f"vLLM on CPU: {available / GIB:.1f} GiB of host memory is available, and the model needs "
            f"{(need.weight_bytes + RUNTIME_BYTES) / GIB:.1f} GiB plus a KV cache of {size / GIB:.2f} GiB for one "
            f"{need.context}-token context; free memory, lower rollout.vllm.max_model_len, or set "
            "VLLM_CPU_KVCACHE_SPACE=<GiB> to size the cache yourself"
        )
    reason = (
        f"KV cache {size / GIB:.2f} GiB ({size // need.kv_bytes_per_token:,} tokens): {available / GIB:.1f} GiB "
        f"available, {reserve / GIB:.1f} GiB kept for weights, runtime{' and trainer' if trainer else ''}, half "
        f"the rest, capped at {min(CPU_KV_CACHE_CAP, useful) / GIB:.2f} GiB (VLLM_CPU_KVCACHE_SPACE=<GiB> overrides)"
    )
    return KVCachePlan(size, reason)


def cpu_kv_cache_plan(model: str, *, dtype: str, max_model_len: int | None, max_num_seqs: int | None) -> KVCachePlan:
    """The plan for this host and model (what the engines pass to vLLM as `kv_cache_memory_bytes`)."""
    need = ModelMemory.from_folder(model, dtype=dtype, max_model_len=max_model_len)
    return plan_cpu_kv_cache(need, available=available_memory_bytes(), max_num_seqs=max_num_seqs)
