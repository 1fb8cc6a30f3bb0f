"""Live latency per pool, as one gateway replica measures it, for policy scoring.

Rule: keep the last ``window`` TTFTs and inter-token gaps of each pool; the p95 of each
is recomputed at most every ``every`` new observations (so a policy decision reads a
cached number). A pool with fewer than ``min_samples`` TTFTs reports None, and the
policy falls back to the declared profile.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from app.stats import percentile

WINDOW = 256
EVERY = 32
MIN_SAMPLES = 20


def _p95(values: Iterable[float]) -> float | None:
    return percentile(list(values), 95)


class _PoolStats:
    def __init__(self, window: int) -> None:
        self.ttft: deque[float] = deque(maxlen=window)
        self.itl: deque[float] = deque(maxlen=window)
        self.fresh = 0
        self.cached: tuple[float | None, float | None] = (None, None)


class LiveLatency:
    def __init__(self, window: int = WINDOW, every: int = EVERY, min_samples: int = MIN_SAMPLES):
        self._window = window
        self._every = every
        self._min = min_samples
        self._pools: dict[str, _PoolStats] = {}

    def observe(self, pool: str, ttft_s: float | None, itls_s: Iterable[float]) -> None:
        stats = self._pools.get(pool)
        if stats is None:
            stats = self._pools[pool] = _PoolStats(self._window)
        if ttft_s is not None:
            stats.ttft.append(ttft_s * 1000.0)
        stats.itl.extend(gap * 1000.0 for gap in itls_s)
        stats.fresh += 1
        if stats.fresh >= self._every:
            self._recompute(stats)

    def _recompute(self, stats: _PoolStats) -> None:
        stats.fresh = 0
        if len(stats.ttft) < self._min:
            stats.cached = (None, None)
            return
        stats.cached = (_p95(stats.ttft), _p95(stats.itl))

    def p95_ms(self, pool: str) -> tuple[float | None, float | None]:
        """(p95 TTFT, p95 ITL) in milliseconds, or Nones while too few samples."""
        stats = self._pools.get(pool)
        return (None, None) if stats is None else stats.cached
