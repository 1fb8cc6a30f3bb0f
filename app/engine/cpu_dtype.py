"""The dtype ``dtype: auto`` serves a text model with on a CPU, from the CPU's own ISA.

vLLM's ``auto`` takes the checkpoint's dtype (bfloat16 for SmolLM2) whatever the CPU
can compute, so the choice is made here, on the node the engine runs on:

- ``amx_bf16`` (Sapphire Rapids and later): float32. oneDNN's AMX bf16 matmuls changed
  SmolLM2-135M's greedy answers badly ("What is the capital of France?" no longer said
  Paris); float32 answers as intended at about 10 % less speed.
- ``avx512_bf16`` without AMX (Cooper Lake, Zen 4/5): bfloat16. Native bf16 dot products
  (VDPBF16PS) halve the weight and KV traffic.
- otherwise (AVX2, AVX-512 without BF16): float32. bf16 arithmetic is emulated there,
  slower than float32.

The flags are read from ``/proc/cpuinfo`` (Linux; anything else reads as no flags, so
float32). An explicit ``dtype`` is never changed.
"""

from __future__ import annotations

import functools
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def choose(flags: frozenset[str]) -> str:
    """The dtype for a CPU with ``flags`` (module docstring)."""
    if "amx_bf16" in flags:
        return "float32"
    if "avx512_bf16" in flags:
        return "bfloat16"
    return "float32"


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first processor's flags (empty where the file is not there)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@functools.cache
def auto_dtype() -> str:
    """The dtype for this node's CPU (read once per process)."""
    return choose(cpu_flags())
