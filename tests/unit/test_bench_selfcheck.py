"""app.bench.selfcheck: an overloaded generator marks its own run invalid; warm-up
windows are left out; CPU is measured; GC is paused while measuring."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.bench.selfcheck import MAX_LAG_P99_S, SelfCheck, gc_paused


@pytest.mark.parametrize(
    ("send_lags", "valid"),
    [
        ([0.001] * 100, True),
        ([0.001] * 98 + [0.2, 0.2], False),  # p99 interpolates into the late sends
        ([0.001] * 99 + [0.2], True),  # one late send among 100 is below p99's reach
    ],
)
def test_send_lag_p99_decides_validity(send_lags: list[float], valid: bool) -> None:
    report = SelfCheck().report(send_lags, max_in_flight=4)
    assert report["valid"] is valid
    assert (report["reason"] is None) is valid
    if not valid:
        assert "overloaded" in report["reason"] and report["lag_p99_s"] > MAX_LAG_P99_S


def test_only_loop_ticks_inside_measured_windows_count() -> None:
    check = SelfCheck()
    check.ticks = [(0.5, 0.3), (0.9, 0.3), (2.0, 0.001), (3.0, 0.002), (10.5, 0.4)]
    report = check.report([], max_in_flight=0, windows=[(1.0, 4.0), (11.0, 12.0)])
    assert report["loop_lag_p99_s"] == pytest.approx(0.002, abs=1e-4)
    assert report["valid"] and report["lag_max_s"] == pytest.approx(0.002)
    assert not check.report([], max_in_flight=0)["valid"]  # the same ticks, all counted


async def test_a_blocked_event_loop_is_caught_by_the_ticker() -> None:
    check = SelfCheck()
    check.start()
    await asyncio.sleep(0.05)
    time.sleep(0.08)  # the generator's loop is stuck: chunk timestamps would be late
    await asyncio.sleep(0.02)
    await check.stop()
    report = check.report([0.0] * 10, max_in_flight=1)
    assert report["lag_max_s"] >= 0.07
    assert not report["valid"]


async def test_cpu_use_of_the_process_is_reported() -> None:
    check = SelfCheck()
    check.start()
    deadline = time.perf_counter() + 0.2
    while time.perf_counter() < deadline:  # burn CPU in this process
        sum(range(1000))
    await check.stop()
    report = check.report([], max_in_flight=0)
    assert report["cpu_process_pct"] is not None and report["cpu_process_pct"] > 50
    assert report["cpu_count"] and report["cpu_system_pct"] is not None


def test_gc_is_paused_inside_and_resumed_after() -> None:
    import gc

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
