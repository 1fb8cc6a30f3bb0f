"""The free slots kept for light requests (app.fairness.reserve): D follows the light
slots held as a time-weighted mean, R = min(C − 1, max(H, round(D + z√D) − n)), and D
falls back to 0 after two idle holds. Hand-computed with hold_s = 1 (τ = 4 s)."""

from __future__ import annotations

import math

import pytest

from app.fairness.reserve import LightDemand

HOLD_S = 1.0


def _demand(sigmas: float | None, steps: list[tuple[float, int]], now: float) -> LightDemand:
    """A demand whose light slots changed by ``delta`` at each ``(t, delta)``, read at ``now``."""
    clock = [0.0]
    d = LightDemand(sigmas, lambda: clock[0])
    for t, delta in steps:
        clock[0] = t
        d.change(delta, HOLD_S)
    clock[0] = now
    return d


@pytest.mark.parametrize(
    ("steps", "now", "mean"),
    [
        ([(0, 3)], 0.0, 0.0),  # just taken: nothing averaged yet
        ([(0, 3)], 4.0, 3 * (1 - math.exp(-1))),  # one τ
        ([(0, 3)], 100.0, 3.0),
        ([(0, 3), (100, -3)], 101.0, 3 * math.exp(-1 / 4)),  # left 1 s ago: decaying
        ([(0, 3), (100, -3)], 102.5, 0.0),  # idle past 2 holds: forgotten
        ([(0, 3), (100, -2)], 102.5, 1 + 2 * math.exp(-2.5 / 4)),  # one still held
    ],
)
def test_the_mean_follows_the_light_slots_held(
    steps: list[tuple[float, int]], now: float, mean: float
) -> None:
    assert _demand(1.0, steps, now).mean(HOLD_S) == pytest.approx(mean)


@pytest.mark.parametrize(
    ("sigmas", "steps", "now", "cap", "headroom", "reserve"),
    [
        (None, [(0, 4)], 100.0, 20, 1, 1),  # off: the fixed headroom
        (1.0, [(0, 4)], 0.0, 20, 1, 1),  # no demand measured yet: H
        (1.0, [(0, 4)], 100.0, 20, 1, 2),  # D 4: round(4 + 2) − 4 held
        (2.0, [(0, 4)], 100.0, 20, 1, 4),  # round(4 + 4) − 4
        (1.0, [(0, 1)], 100.0, 20, 1, 1),  # round(1 + 1) − 1 = 1 = H
        (1.0, [(0, 1)], 100.0, 20, 3, 3),  # H is the floor
        (1.0, [(0, 4), (100, -4)], 101.0, 20, 1, 5),  # all just left: round(3.12 + 1.77)
        (1.0, [(0, 4), (100, -4)], 103.0, 20, 1, 1),  # idle 3 holds: H again
        (1.0, [(0, 4), (100, -4)], 101.0, 4, 1, 3),  # never the whole pool: C − 1
        (1.0, [(0, 1), (100, -1)], 101.0, 1, 0, 0),  # one slot: nothing kept
    ],
)
def test_the_reserve_is_the_light_demand_less_what_it_holds(
    sigmas: float | None,
    steps: list[tuple[float, int]],
    now: float,
    cap: int,
    headroom: int,
    reserve: int,
) -> None:
    assert _demand(sigmas, steps, now).reserve(cap, headroom, HOLD_S) == reserve
