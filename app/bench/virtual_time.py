"""Discrete-event time for asyncio code whose every wait on time goes through ``sleep``.

Rule: ``sleep(d)`` parks the caller on a timer at ``now + d``. ``run`` repeats: let
every runnable task run (``settle`` rounds of ``asyncio.sleep(0)``: enough for a chain of
queue hand-offs to finish), then move ``now`` to the earliest timer and wake every
sleeper due then, until ``done()`` or no timer is left (after ``IDLE_ROUNDS`` rounds
without one). Simulated engines (``SimulatedEngine(clock=vt, sleep=vt.sleep)``), arrival
schedules and clients then run
hours of simulated serving in seconds, deterministically for a given seed. Wall-clock
calls (``time.monotonic``) must not decide anything in code run this way.

Parameters: ``settle`` (scheduler rounds between timer firings).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

IDLE_ROUNDS = 10_000  # rounds without any timer before ``run`` decides nothing is left


class VirtualTime:
    def __init__(self, settle: int = 12) -> None:
        self.now = 0.0
        self.settle = settle
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self.now + max(0.0, seconds), next(self._seq), fut))
        await fut

    async def run(self, done: Callable[[], bool], limit_s: float = float("inf")) -> None:
        """Advance time until ``done()``, no timer is left, or ``limit_s`` of simulated
        time has passed."""
        while True:
            for _ in range(self.settle):
                await asyncio.sleep(0)
            idle = 0
            while not self._timers and not done() and idle < IDLE_ROUNDS:
                await asyncio.sleep(0)  # work in flight that has not reached a sleep yet
                idle += 1
            if done() or not self._timers or self._timers[0][0] > limit_s:
                return
            due = self._timers[0][0]
            self.now = due
            while self._timers and self._timers[0][0] <= due:
                _, _, fut = heapq.heappop(self._timers)
                if not fut.done():
                    fut.set_result(None)
