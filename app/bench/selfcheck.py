"""The generator watches itself, so an overloaded client cannot pass for a slow server.

Rule: a run is INVALID when the p99 of its schedule lag exceeds ``MAX_LAG_P99_S``
(5 ms). Schedule lag has two sources, both measured: send lag (a request left later
than its intended time; open loop) and event-loop lag (a ``TICK_S`` timer fired late —
the same lateness delays every chunk timestamp, in any mode). Both count over the
measured windows only (from the end of a stage's warm-up to the end of its load):
warm-up requests and ticks (connection set-up bursts included) are left out, as their
latencies are, and so is the generator's own bookkeeping between stages. The process's
own CPU use (percent of one core) and the whole machine's are reported next to it,
over the run.

Python's cyclic garbage collector is paused while stages run (``gc_paused``): a full
collection stops the event loop for tens of milliseconds once a run holds a thousand
streams; the objects of the set-up are frozen first, and collection resumes after.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.stats import percentile

MAX_LAG_P99_S = 0.005
TICK_S = 0.005


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine from /proc/stat (0, 0 elsewhere)."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


@dataclass
class SelfCheck:
    """Loop-lag ticker plus CPU counters between ``start`` and ``stop``; tick times are
    on ``clock`` (the run clock, so only the measured windows count)."""

    clock: Callable[[], float] = time.perf_counter
    ticks: list[tuple[float, float]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _wall0: float = 0.0
    _cpu0: float = 0.0
    _machine0: tuple[float, float] = (0.0, 0.0)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    machine_pct: float | None = None

    def start(self) -> None:
        self._wall0, self._cpu0 = time.perf_counter(), time.process_time()
        self._machine0 = _machine_busy()
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            due = self.clock() + TICK_S
            await asyncio.sleep(TICK_S)
            now = self.clock()
            self.ticks.append((now, max(0.0, now - due)))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.wall_s = time.perf_counter() - self._wall0
        self.cpu_s = time.process_time() - self._cpu0
        busy1, total1 = _machine_busy()
        busy0, total0 = self._machine0
        if total1 > total0:
            self.machine_pct = 100.0 * (busy1 - busy0) / (total1 - total0)

    def loop_lags(self, windows: Sequence[tuple[float, float]] | None = None) -> list[float]:
        """Tick lags inside the ``(start, end)`` measured windows (all without windows)."""
        if windows is None:
            return [lag for _, lag in self.ticks]
        return [lag for t, lag in self.ticks if any(a <= t < b for a, b in windows)]

    def report(
        self,
        send_lags: Sequence[float],
        max_in_flight: int,
        windows: Sequence[tuple[float, float]] | None = None,
    ) -> dict[str, Any]:
        """``send_lags`` of the measured requests; ``windows`` the measured windows."""
        loop_lags = self.loop_lags(windows)
        send_p99 = percentile(send_lags, 99) or 0.0
        loop_p99 = percentile(loop_lags, 99) or 0.0
        lag_p99 = max(send_p99, loop_p99)
        valid = lag_p99 <= MAX_LAG_P99_S
        return {
            "lag_p50_s": percentile(send_lags, 50),
            "lag_p99_s": lag_p99,
            "lag_max_s": max([*send_lags, *loop_lags], default=0.0),
            "send_lag_p99_s": send_p99,
            "loop_lag_p99_s": loop_p99,
            "cpu_process_pct": 100.0 * self.cpu_s / self.wall_s if self.wall_s else None,
            "cpu_system_pct": self.machine_pct,
            "cpu_count": os.cpu_count(),
            "max_in_flight": max_in_flight,
            "max_lag_p99_s": MAX_LAG_P99_S,
            "valid": valid,
            "reason": None
            if valid
            else f"schedule lag p99 {lag_p99 * 1e3:.1f} ms > {MAX_LAG_P99_S * 1e3:.0f} ms: "
            "the generator was overloaded, latencies include its own delay",
        }


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Freeze what exists, pause the cyclic collector; collect and resume on exit."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
        gc.collect()
