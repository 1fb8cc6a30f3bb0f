"""app.bench.schedule: rates, burstiness, determinism, stage parsing."""

from __future__ import annotations

import itertools
import statistics

import pytest

from app.bench.schedule import arrivals, parse_stages


@pytest.mark.parametrize("kind", ["poisson", "gamma", "constant"])
def test_the_last_arrival_lands_exactly_at_n_over_rate(kind: str) -> None:
    offsets = arrivals(kind, rate=200.0, n=1000, burstiness=0.5, seed=3)  # type: ignore[arg-type]
    assert len(offsets) == 1000
    assert offsets[-1] == pytest.approx(1000 / 200.0, rel=1e-12)
    assert all(b >= a for a, b in itertools.pairwise(offsets))


def test_constant_gaps_are_all_one_over_rate() -> None:
    gaps = _gaps(arrivals("constant", rate=50.0, n=100))
    assert min(gaps) == pytest.approx(0.02) and max(gaps) == pytest.approx(0.02)


@pytest.mark.parametrize(
    ("kind", "burstiness", "cv_low", "cv_high"),
    [
        # coefficient of variation of gamma gaps is 1/sqrt(shape)
        ("poisson", 1.0, 0.9, 1.1),
        ("gamma", 0.25, 1.8, 2.2),
        ("gamma", 4.0, 0.45, 0.55),
    ],
)
def test_burstiness_sets_the_gap_variability(
    kind: str, burstiness: float, cv_low: float, cv_high: float
) -> None:
    gaps = _gaps(arrivals(kind, 100.0, 20000, burstiness=burstiness, seed=1))  # type: ignore[arg-type]
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv_low < cv < cv_high
    assert statistics.fmean(gaps) == pytest.approx(0.01, rel=1e-3)


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    a = arrivals("poisson", 10.0, 50, seed=7)
    assert a == arrivals("poisson", 10.0, 50, seed=7)
    assert a != arrivals("poisson", 10.0, 50, seed=8)


@pytest.mark.parametrize(
    ("args", "message"),
    [({"rate": 0.0}, "rate"), ({"rate": 1.0, "burstiness": 0.0, "kind": "gamma"}, "burstiness")],
)
def test_bad_parameters_are_refused(args: dict[str, float], message: str) -> None:
    kwargs = {"kind": "poisson", "n": 10, **args}
    with pytest.raises(ValueError, match=message):
        arrivals(**kwargs)  # type: ignore[arg-type]


def test_zero_arrivals_is_an_empty_schedule() -> None:
    assert arrivals("poisson", 5.0, 0) == []


@pytest.mark.parametrize(
    ("text", "expected"), [("1,8,32", [1.0, 8.0, 32.0]), (" 2.5 , 5 ", [2.5, 5.0])]
)
def test_parse_stages(text: str, expected: list[float]) -> None:
    assert parse_stages(text) == expected


@pytest.mark.parametrize("text", ["", "1,-2", "0"])
def test_parse_stages_refuses_nonpositive_or_empty(text: str) -> None:
    with pytest.raises(ValueError):
        parse_stages(text)


def _gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
