"""Each pool's draft acceptance from the replicas' speculative totals
(app.routing.acceptance): increments per engine, the window, the floor of evidence."""

from __future__ import annotations

import pytest

from app.engine.protocol import SpecCounters
from app.routing.acceptance import DraftAcceptance


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# (at, pool, engine, drafted total, accepted total) observations, then what each pool reads
Obs = tuple[float, str, str, int, int]


@pytest.mark.parametrize(
    ("observations", "read_at", "expected"),
    [
        # one engine, growing totals: the increments add up to the last totals
        ([(0, "p", "e1", 100, 80), (1, "p", "e1", 300, 150)], 2, {"p": 0.5}),
        # a repeated report adds nothing
        ([(0, "p", "e1", 300, 150), (1, "p", "e1", 300, 150)], 2, {"p": 0.5}),
        # two engines of one pool: their own increments, summed
        ([(0, "p", "e1", 200, 200), (0, "p", "e2", 200, 0)], 1, {"p": 0.5}),
        # below min_draft_tokens (100 here) drafted: unknown
        ([(0, "p", "e1", 99, 99)], 1, {"p": None}),
        # pools apart; a pool never seen is unknown
        ([(0, "a", "e1", 100, 90), (0, "b", "e2", 100, 10)], 1,
         {"a": 0.9, "b": 0.1, "c": None}),
        # samples older than the window (60 s) age out: the measure is unknown again
        ([(0, "p", "e1", 1000, 100)], 61, {"p": None}),
        # ... only the old ones: the young increment alone decides
        ([(0, "p", "e1", 1000, 100), (50, "p", "e1", 1200, 300)], 61, {"p": 1.0}),
        ([(0, "p", "e1", 1000, 100), (50, "p", "e1", 1099, 190)], 61, {"p": None}),
        # totals that fell (the engine restarted under the same name): counted from zero
        ([(0, "p", "e1", 1000, 900), (1, "p", "e1", 200, 20)], 2, {"p": (900 + 20) / 1200}),
    ],
)  # fmt: skip
def test_acceptance_over_the_window(
    observations: list[Obs], read_at: float, expected: dict[str, float | None]
) -> None:
    clock = Clock()
    measure = DraftAcceptance(window_s=60, min_draft_tokens=100, clock=clock)
    for at, pool, engine, drafted, accepted in observations:
        clock.now = at
        measure.observe(pool, SpecCounters(engine, drafted, accepted))
    clock.now = read_at
    assert {pool: measure(pool) for pool in expected} == pytest.approx(expected)


def test_a_held_off_pool_is_probed_again_once_its_low_measure_ages_out() -> None:
    clock = Clock()
    measure = DraftAcceptance(window_s=60, min_draft_tokens=100, clock=clock)
    measure.observe("p", SpecCounters("e1", 500, 50))
    assert measure("p") == pytest.approx(0.1)
    clock.now = 59.9
    assert measure("p") == pytest.approx(0.1)
    clock.now = 60.1  # no new samples came (the routes held the pool off)
    assert measure("p") is None
