"""app/stats.py: the one percentile definition (linear interpolation, numpy's)."""

from __future__ import annotations

import pytest

from app.stats import percentile


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),
        ([7.0], 99, 7.0),
        ([0.3, 0.1, 0.2], 0, 0.1),
        ([0.3, 0.1, 0.2], 50, 0.2),
        ([0.3, 0.1, 0.2], 95, 0.29),
        ([0.3, 0.1, 0.2], 100, 0.3),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([float(i) for i in range(1, 301)], 99, 297.01),
    ],
)
def test_percentile(values: list[float], q: float, expected: float | None) -> None:
    assert percentile(values, q) == (None if expected is None else pytest.approx(expected))
