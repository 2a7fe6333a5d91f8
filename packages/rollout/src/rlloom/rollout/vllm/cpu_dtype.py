"""Which dtype vLLM runs in on a CPU when asked for "auto".

vLLM's own "auto" runs a float32 checkpoint in bfloat16 on CPU. oneDNN multiplies bf16 natively only with
AVX512-BF16 or AMX on x86 (the BF16 extension on Arm); on an AVX2-only CPU (this project's CI hosts include AMD
EPYC machines with AVX2 and no AVX-512) vLLM logs "Failed to create oneDNN linear, fallback to torch linear" and
runs emulated bf16 matmuls: a 100-question SmolLM2-135M agent eval that took 198 s went past 36 minutes.
So the engines' "auto" is float32 on a CPU without native bf16, and vLLM's own "auto" elsewhere; an explicit
dtype is always passed through. bench/vllm_cpu_dtype.py measures the two on the machine at hand.
"""

from __future__ import annotations

import logging
import platform
from pathlib import Path

log = logging.getLogger(__name__)

NATIVE_BF16_FLAGS = {
    "x86_64": ("avx512_bf16", "amx_bf16"),
    "aarch64": ("bf16",),
}
"""/proc/cpuinfo flags that give oneDNN native bf16 matmuls, by machine (Linux's names)."""


def cpu_bf16_flags(cpuinfo: str | None = None, machine: str | None = None) -> list[str]:
    """The native-bf16 flags this CPU reports (empty: none, or no /proc/cpuinfo to read)."""
    machine = machine or platform.machine()
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    words: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            words.update(value.split())
    return [flag for flag in NATIVE_BF16_FLAGS.get(machine, ()) if flag in words]


def engine_dtype(requested: str, *, on_cpu: bool, cpuinfo: str | None = None, machine: str | None = None) -> str:
    """The dtype to start vLLM with: `requested`, except "auto" on a CPU without native bf16, which is float32."""
    if requested != "auto" or not on_cpu:
        return requested
    if cpu_bf16_flags(cpuinfo, machine):
        return "auto"
    log.info(
        "vLLM on CPU: dtype auto -> float32 (this CPU has no native bf16: no %s in /proc/cpuinfo; bf16 would run "
        "emulated, several times slower); pass dtype=bfloat16 to force it",
        " / ".join(NATIVE_BF16_FLAGS.get(machine or platform.machine(), ("a bf16 flag",))),
    )
    return "float32"
