"""Arrival schedules of the open-loop generator.

Rule (as ``vllm bench serve``): inter-arrival gaps are drawn from a gamma distribution
with shape ``burstiness`` and scale ``1 / (rate * burstiness)`` (mean ``1 / rate``);
``burstiness`` 1 is a Poisson process, below 1 burstier, above 1 more regular, and
``constant`` is the limit (every gap exactly ``1 / rate``). Offsets are cumulative
seconds from the stage start and are rescaled so the ``n``-th arrival lands exactly at
``n / rate``: the offered rate is the target rate, not a random draw around it (an
unscaled Poisson sum of 12,000 gaps misses it by about 1 %). Deterministic in ``seed``.
"""

from __future__ import annotations

import random
from typing import Literal

Arrival = Literal["poisson", "gamma", "constant"]


def arrivals(
    kind: Arrival, rate: float, n: int, *, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Intended send offsets (s) of ``n`` arrivals at ``rate`` req/s."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    if n <= 0:
        return []
    if kind == "constant":
        return [(i + 1) / rate for i in range(n)]
    shape = 1.0 if kind == "poisson" else burstiness
    if shape <= 0:
        raise ValueError("burstiness must be positive")
    rng = random.Random(seed)
    scale = 1.0 / (rate * shape)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(shape, scale)
        out.append(t)
    factor = (n / rate) / out[-1]
    return [x * factor for x in out]


def parse_stages(text: str) -> list[float]:
    """``"1,8,32"`` → ``[1.0, 8.0, 32.0]`` (concurrency levels or rates of a ramp)."""
    stages = [float(part) for part in text.split(",") if part.strip()]
    if not stages or any(s <= 0 for s in stages):
        raise ValueError(f"stages must be positive numbers, got {text!r}")
    return stages


DEFAULT_CONCURRENCY_STAGES: tuple[int, ...] = (1, 8, 32, 64, 128, 256, 512, 1000, 1500)
"""Seed 003 §8.2."""
