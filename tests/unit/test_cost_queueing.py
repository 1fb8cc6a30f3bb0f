"""Erlang C and the Poisson rate within a wait budget (app.cost.queueing), against
hand-computed M/M/1 and M/M/2 cases."""

from __future__ import annotations

import math

import pytest

from app.cost.queueing import erlang_c, max_rate, wait_tail


@pytest.mark.parametrize(
    ("servers", "load", "expected"),
    [
        (1, 0.5, 0.5),  # M/M/1: P(wait) = ρ
        (1, 0.9, 0.9),
        (2, 1.0, 1 / 3),  # (1/2 · 2) / (1 + 1 + 1) = 1/3
        (2, 0.0, 0.0),
        (2, 2.0, 1.0),  # saturated
    ],
)
def test_erlang_c(servers: int, load: float, expected: float) -> None:
    assert erlang_c(servers, load) == pytest.approx(expected)


def test_the_wait_tail_of_an_mm1_queue() -> None:
    # M/M/1, λ = 0.5/s, S = 1 s: P(W > t) = ρ · exp(−(μ − λ) t)
    assert wait_tail(0.5, 1, 1.0, 2.0) == pytest.approx(0.5 * math.exp(-0.5 * 2.0))
    assert wait_tail(1.0, 1, 1.0, 2.0) == 1.0


def test_max_rate_meets_the_tail_exactly_and_grows_with_the_budget() -> None:
    rate = max_rate(2, 4.0, 0.7)
    assert 0 < rate < 2 / 4.0
    assert wait_tail(rate, 2, 4.0, 0.7) == pytest.approx(0.05, abs=1e-6)
    assert max_rate(2, 4.0, 3.0) > rate  # more room to wait: more arrivals
    assert max_rate(8, 4.0, 0.7) > 4 * rate  # more slots: far more (pooling)
    assert max_rate(2, 4.0, 0.0) == 0.0
