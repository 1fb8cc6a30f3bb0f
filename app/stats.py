"""The one percentile definition every number Switchyard reports uses (benchmarks,
reports, live pool latency): the q-th percentile, 0..100, with linear interpolation
between the closest ranks (numpy's default, vLLM's benchmark client's)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """q-th percentile (0..100) of ``values``, linear interpolation; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
