"""vLLM's dtype on CPU: "auto" becomes float32 where the CPU has no native bf16 (bf16 would run emulated), stays
vLLM's own "auto" where it has, and an explicit dtype or a GPU is never touched. The cpuinfo texts are trimmed
copies of real /proc/cpuinfo lines (an AVX2-only AMD EPYC, a Sapphire Rapids Xeon, a Graviton 3)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlloom.rollout.vllm.cpu_dtype import cpu_bf16_flags, engine_dtype

EPYC_AVX2 = """processor	: 0
vendor_id	: AuthenticAMD
model name	: AMD EPYC
flags		: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht \
syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm rep_good nopl cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 \
fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy avx2 bmi2
"""
XEON_SPR = """processor	: 0
model name	: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags		: fpu sse sse2 avx avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_fp16 amx_bf16 amx_tile \
amx_int8
"""
XEON_AVX512_ONLY = """model name	: Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz
flags		: fpu sse sse2 avx avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni
"""
GRAVITON3 = """processor	: 0
BogoMIPS	: 2100.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop \
sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng
"""
GRAVITON2 = """processor	: 0
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
"""


@pytest.mark.parametrize(
    ("cpuinfo", "machine", "flags", "auto"),
    [
        (EPYC_AVX2, "x86_64", [], "float32"),
        (XEON_AVX512_ONLY, "x86_64", [], "float32"),  # AVX-512 without its BF16 extension: emulated too
        (XEON_SPR, "x86_64", ["avx512_bf16", "amx_bf16"], "auto"),
        (GRAVITON3, "aarch64", ["bf16"], "auto"),  # "svebf16" alone would not count: whole words only
        (GRAVITON2, "aarch64", [], "float32"),
    ],
)
def test_auto_is_float32_without_native_bf16(cpuinfo: str, machine: str, flags: list[str], auto: str) -> None:
    assert cpu_bf16_flags(cpuinfo, machine) == flags
    assert engine_dtype("auto", on_cpu=True, cpuinfo=cpuinfo, machine=machine) == auto


@pytest.mark.parametrize("explicit", ["float32", "bfloat16", "float16"])
def test_an_explicit_dtype_and_a_gpu_are_left_alone(explicit: str) -> None:
    assert engine_dtype(explicit, on_cpu=True, cpuinfo=EPYC_AVX2, machine="x86_64") == explicit
    assert engine_dtype("auto", on_cpu=False, cpuinfo=EPYC_AVX2, machine="x86_64") == "auto"


def test_the_choice_is_logged_with_how_to_force_bf16(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="rlloom.rollout.vllm.cpu_dtype"):
        engine_dtype("auto", on_cpu=True, cpuinfo=EPYC_AVX2, machine="x86_64")
    assert "auto -> float32" in caplog.text
    assert "avx512_bf16 / amx_bf16" in caplog.text and "dtype=bfloat16" in caplog.text


def test_an_unknown_machine_or_no_cpuinfo_means_no_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cpu_bf16_flags(XEON_SPR, "riscv64") == []
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: (_ for _ in ()).throw(OSError("no /proc")))
    assert cpu_bf16_flags(None, "x86_64") == []


def test_the_engines_start_vllm_with_the_resolved_dtype(smollm2_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """platform_kwargs carries the dtype both engines start vLLM with, and sizes the KV cache for it."""
    from rlloom.rollout.vllm import cpu_dtype
    from rlloom.rollout.vllm.engine import VLLMEngineConfig, platform_kwargs

    config = VLLMEngineConfig(model=str(smollm2_folder), max_model_len=1024, max_num_seqs=8)
    monkeypatch.setattr(cpu_dtype, "cpu_bf16_flags", lambda *a, **k: [])
    assert platform_kwargs(config, on_cpu=True)["dtype"] == "float32"
    monkeypatch.setattr(cpu_dtype, "cpu_bf16_flags", lambda *a, **k: ["amx_bf16"])
    assert platform_kwargs(config, on_cpu=True)["dtype"] == "auto"
    assert platform_kwargs(config.model_copy(update={"dtype": "bfloat16"}), on_cpu=True)["dtype"] == "bfloat16"
