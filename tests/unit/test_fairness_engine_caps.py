"""The engine caps of a pool (app.fairness.engine_caps): when a replica's view is full,
the freeze at what runs, every fresh view needed, and the lapse on stale views."""

from __future__ import annotations

import pytest

from app.engine.protocol import EngineLoad
from app.fairness.engine_caps import EngineCap, EngineCaps

FULL = EngineLoad(running=4, waiting=3, kv_cache_usage=0.5)
ROOMY = EngineLoad(running=2, waiting=0, kv_cache_usage=0.5)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def caps(clock: Clock) -> EngineCaps:
    return EngineCaps(max_waiting=2, max_kv_usage=0.95, stale_s=5.0, clock=clock)


@pytest.mark.parametrize(
    ("waiting", "kv", "full"),
    [(3, 0.10, True), (2, 0.10, False), (0, 0.95, True), (2, 0.94, False), (0, 1.0, True)],
)
def test_a_view_is_full_past_its_waiting_or_kv_threshold(
    waiting: int, kv: float, full: bool
) -> None:
    c = caps(Clock())
    assert c.full(EngineLoad(running=4, waiting=waiting, kv_cache_usage=kv)) is full
    c.observe("r1", EngineLoad(running=4, waiting=waiting, kv_cache_usage=kv), running=1)
    assert c.limit(4) == (1 if full else 4)


def test_the_freeze_needs_every_fresh_replica_view_full_and_a_roomy_one_lifts_it() -> None:
    clock = Clock()
    c = caps(clock)
    assert c.observe("r1", FULL, running=2) is False and c.limit(4) == 2
    assert c.observe("r2", ROOMY, running=2) is True  # the replica router can place it there
    assert c.limit(4) == 4
    assert c.observe("r2", FULL, running=3) is False and c.limit(4) == 3
    clock.now = 6.0  # r1's and r2's views age out: a new full one alone decides
    c.observe("r3", FULL, running=1)
    assert c.limit(4) == 1 and c.limit(0) == 0  # never above the slots
    assert c.counts == {"held": 2, "stale": 0}


def test_without_a_newer_full_view_the_freeze_lapses_and_is_counted_stale() -> None:
    clock = Clock()
    c = caps(clock)
    counted: list[EngineCap] = []
    c.on_count = counted.append
    c.observe("r1", FULL, running=1)
    clock.now = 3.0
    assert c.due_s() == 2.0 and c.limit(4) == 1
    c.observe("r1", FULL, running=1)  # a newer full view renews the freeze
    clock.now = 7.5
    assert c.limit(4) == 1
    clock.now = 8.1
    assert c.limit(4) == 4 and c.frozen is None and c.due_s() == 0.0
    assert counted == ["held", "stale"] and c.counts == {"held": 1, "stale": 1}
