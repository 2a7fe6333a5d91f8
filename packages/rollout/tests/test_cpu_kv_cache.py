"""vLLM's KV cache on a CPU host is sized from free memory and the model (vllm/cpu_memory.py), not from a share of
total RAM; the figures below are worked by hand from the rule in that module's docstring."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlloom.rollout.vllm.cpu_memory import (
    CPU_KV_CACHE_CAP,
    GIB,
    RUNTIME_BYTES,
    ModelMemory,
    available_memory_bytes,
    plan_cpu_kv_cache,
)


def test_model_needs_from_its_folder(smollm2_folder: Path) -> None:
    need = ModelMemory.from_folder(str(smollm2_folder), dtype="float32", max_model_len=1024)
    assert need.weight_bytes == 538_090_408
    assert need.parameters == 538_090_408 // 4
    assert need.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4 == 46_080  # K and V, per layer, per KV head
    assert need.context == 1024
    for dtype in ("bfloat16", "auto"):  # vLLM's auto runs an fp32 checkpoint in bf16 on CPU
        bf16 = ModelMemory.from_folder(str(smollm2_folder), dtype=dtype)
        assert (bf16.kv_bytes_per_token, bf16.context) == (23_040, 8192)


def test_a_24_gib_host_beside_other_work_gets_a_capped_cache_not_half_its_ram(smollm2_folder: Path) -> None:
    need = ModelMemory.from_folder(str(smollm2_folder), dtype="float32", max_model_len=4096)
    # 10 GiB free of 24: vLLM's default (0.5 x 24 = 12 GiB) would refuse to start
    plan = plan_cpu_kv_cache(need, available=10 * GIB, env={})
    reserve = 538_090_408 + RUNTIME_BYTES + 16 * (538_090_408 // 4)
    assert plan.kv_cache_bytes == min(CPU_KV_CACHE_CAP, (10 * GIB - reserve) // 2)
    # reserved: 538,090,408 weights + 1,610,612,736 runtime + 16 x 134,522,602 trainer = 4,301,064,776 (4.0 GiB)
    assert plan.kv_cache_bytes == (10_737_418_240 - 4_301_064_776) // 2 == 3_218_176_732  # 3.0 GiB, under the cap
    assert "10.0 GiB available" in plan.reason and "VLLM_CPU_KVCACHE_SPACE" in plan.reason


def test_a_roomy_host_is_capped_and_a_small_batch_needs_less(smollm2_folder: Path) -> None:
    need = ModelMemory.from_folder(str(smollm2_folder), dtype="float32", max_model_len=1024)
    assert plan_cpu_kv_cache(need, available=100 * GIB, env={}).kv_cache_bytes == CPU_KV_CACHE_CAP
    few = plan_cpu_kv_cache(need, available=100 * GIB, max_num_seqs=8, env={})
    assert few.kv_cache_bytes == 8 * 1024 * 46_080  # 8 full contexts are all it can use


def test_a_tight_host_gets_one_context_and_a_hopeless_one_an_error(smollm2_folder: Path) -> None:
    need = ModelMemory.from_folder(str(smollm2_folder), dtype="float32", max_model_len=1024)
    plan = plan_cpu_kv_cache(need, available=2 * GIB + 100 * 2**20, env={})  # less than the trainer's share left
    assert plan.kv_cache_bytes == 1024 * 46_080
    with pytest.raises(ValueError, match=r"max_model_len.*VLLM_CPU_KVCACHE_SPACE"):
        plan_cpu_kv_cache(need, available=GIB, env={})


def test_the_users_environment_wins(smollm2_folder: Path) -> None:
    need = ModelMemory.from_folder(str(smollm2_folder), dtype="float32")
    plan = plan_cpu_kv_cache(need, available=GIB, env={"VLLM_CPU_KVCACHE_SPACE": "3"})
    assert plan.kv_cache_bytes is None and "3 GiB from VLLM_CPU_KVCACHE_SPACE" in plan.reason


def test_available_memory_is_what_the_kernel_reports() -> None:
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    reported = int(meminfo["MemAvailable"].split()[0]) * 1024
    assert 0 < available_memory_bytes() <= reported + 256 * 2**20  # it moves a little between the two reads


def test_engines_compile_by_default_and_pass_the_planned_cache(smollm2_folder: Path) -> None:
    from rlloom.rollout.vllm.engine import VLLMEngineConfig, platform_kwargs

    config = VLLMEngineConfig(model=str(smollm2_folder), dtype="float32", max_model_len=1024, max_num_seqs=8)
    kwargs = platform_kwargs(config, on_cpu=True)
    # compiled: decoding 1.35x faster than eager on CPU for a 1.8 min longer start (bench/vllm_cpu_start.py)
    assert kwargs["enforce_eager"] is False
    assert 1024 * 46_080 <= kwargs["kv_cache_memory_bytes"] <= 8 * 1024 * 46_080  # one to max_num_seqs contexts
    explicit = platform_kwargs(config.model_copy(update={"kv_cache_memory_bytes": 123 << 20}), on_cpu=True)
    assert explicit["kv_cache_memory_bytes"] == 123 << 20
    assert "kv_cache_memory_bytes" not in platform_kwargs(config, on_cpu=False)  # GPUs: gpu_memory_utilization
