"""EngineTelemetry (app.engine.telemetry): gauges, totals and bounded samples."""

from __future__ import annotations

import pytest

from app.engine.telemetry import EngineTelemetry, RequestTimes


@pytest.mark.parametrize(("usage", "kept"), [(-0.1, 0.0), (0.5, 0.5), (1.3, 1.0)])
def test_kv_usage_is_a_fraction(usage: float, kept: float) -> None:
    t = EngineTelemetry()
    t.step(1, 0, usage, tokens=4)
    assert t.kv_cache_usage == kept


def test_drain_hands_over_each_sample_once() -> None:
    t = EngineTelemetry()
    t.step(2, 1, 0.2, tokens=130)
    t.step(2, 0, 0.2, tokens=0)  # an idle report: no step size
    t.finished(0.1, 0.2, -0.01)  # clock noise never goes negative
    assert t.drain().step_tokens == (130,)
    t.finished(1.0, 1.0, 1.0)
    again = t.drain()
    assert again.requests == (RequestTimes(1.0, 1.0, 1.0),) and again.step_tokens == ()
    assert t.steps_total == 2


def test_undrained_samples_are_bounded_oldest_first_out() -> None:
    t = EngineTelemetry(keep=3)
    for i in range(5):
        t.step(1, 0, 0.0, tokens=i + 1)
        t.finished(float(i), 0.0, 0.0)
    samples = t.drain()
    assert samples.step_tokens == (3, 4, 5)
    assert [r.queued_s for r in samples.requests] == [2.0, 3.0, 4.0]


def test_totals_add_up() -> None:
    t = EngineTelemetry()
    t.prefix_lookup(100, 64)
    t.prefix_lookup(10, 0)
    t.preempted(2)
    assert (t.prefix_queried_tokens_total, t.prefix_hit_tokens_total, t.preemptions_total) == (
        110, 64, 2,
    )  # fmt: skip
