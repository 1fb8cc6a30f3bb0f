"""``dtype: auto`` on a CPU follows its ISA: float32 with AMX (its bf16 matmuls change
greedy answers), bfloat16 with AVX-512 BF16 alone, float32 where bf16 is emulated."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.cpu_dtype import choose, cpu_flags

SAPPHIRE_RAPIDS = "fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"
ZEN4 = "fpu avx2 avx512f avx512_bf16"
ICELAKE = "fpu avx2 avx512f avx512vl"
ZEN2 = "fpu sse4_2 avx2 fma"


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [(SAPPHIRE_RAPIDS, "float32"), (ZEN4, "bfloat16"), (ICELAKE, "float32"), (ZEN2, "float32"),
     ("", "float32")],
    ids=["amx", "avx512-bf16", "avx512-no-bf16", "avx2", "unknown"],
)  # fmt: skip
def test_the_dtype_per_isa(flags: str, dtype: str) -> None:
    assert choose(frozenset(flags.split())) == dtype


def test_the_flags_come_from_the_first_processor(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {ZEN4}\n\nprocessor\t: 1\nflags\t\t: {ZEN2}\n")
    assert cpu_flags(info) == frozenset(ZEN4.split())
    assert cpu_flags(tmp_path / "absent") == frozenset()
    (tmp_path / "noflags").write_text("processor\t: 0\n")
    assert cpu_flags(tmp_path / "noflags") == frozenset()
