"""benchmarks/itl_tail.py: the stall rule, the periodicity measure and the CPU shares
(the pure parts; the run itself needs the two servers)."""

from __future__ import annotations

import pytest

from benchmarks.itl_tail import Sampler, resultant, summarize


@pytest.mark.parametrize(
    ("times", "period", "expected"),
    [
        ([0.0, 2.0, 4.0, 6.0], 2.0, 1.0),  # every stall at the same phase
        ([0.0, 0.5, 1.0, 1.5], 2.0, 0.0),  # spread evenly over the period
        ([0.0, 1.0], 2.0, 0.0),  # opposite phases
        ([], 2.0, 0.0),
    ],
)
def test_resultant(times: list[float], period: float, expected: float) -> None:
    assert resultant(times, period) == pytest.approx(expected, abs=1e-9)


def test_stalls_are_gaps_over_twice_the_median_and_their_cpu_is_attributed() -> None:
    gaps = [(1.0 + i * 0.1, 0.1) for i in range(9)] + [(3.0, 0.5)]  # one 0.5 s stall
    sampler = Sampler.__new__(Sampler)
    # the ingress burns a whole core from 2.5 to 3.0 s (the stall), nothing before
    sampler.samples = [(t / 10, {"path/ingress": max(0.0, min(t / 10, 3.0) - 2.5)})
                       for t in range(0, 31)]  # fmt: skip
    s = summarize(gaps, sampler)
    assert (s["tokens"], s["stalls"], s["max_ms"]) == (10, 1, 500.0)
    assert s["stall_excess_s"] == pytest.approx(0.4)
    assert s["p50_ms"] == pytest.approx(100.0)
    assert s["cpu_share_stalls"]["path/ingress"] == pytest.approx(1.0)
    assert s["cpu_share_all"]["path/ingress"] == pytest.approx(0.5 / 3.0)
