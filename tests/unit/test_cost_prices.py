"""The price table: every shipped row dated and sourced; bad rows refused by name."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from app.cost.prices import load_prices, parse_prices

SHIPPED = Path(__file__).parents[2] / "prices.yaml"
ROW: dict[str, Any] = {
    "provider": "p",
    "model": "m",
    "input_per_1m": 0.1,
    "output_per_1m": 0.4,
    "date": "2026-06-01",
    "source": "https://example.invalid/pricing",
}


def test_the_shipped_table_loads_dated_and_sourced() -> None:
    table = load_prices(SHIPPED)
    assert len(table.rows) >= 4
    assert all(isinstance(r.date, dt.date) and r.source.startswith("https://") for r in table.rows)
    assert table.find("gpt-4o-mini").output_per_1m > table.find("gpt-4o-mini").input_per_1m


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"date": None}, r"price row 1 \(p/m\): date"),
        ({"source": ""}, r"price row 1 \(p/m\): source"),
        ({"input_per_1m": -1}, r"price row 1 \(p/m\): input_per_1m"),
        ({"currency": "EUR"}, r"price row 1 \(p/m\): currency"),
    ],
)
def test_a_bad_row_is_refused_by_name(change: dict[str, Any], message: str) -> None:
    row = {k: v for k, v in (ROW | change).items() if v is not None}
    with pytest.raises(ValueError, match=message):
        parse_prices({"rows": [row]})


def test_newest_row_wins_and_duplicates_are_refused() -> None:
    table = parse_prices({"rows": [ROW, ROW | {"date": "2026-07-01", "input_per_1m": 0.2}]})
    assert table.find("p/m").input_per_1m == 0.2
    with pytest.raises(ValueError, match="a second row for p/m"):
        parse_prices({"rows": [ROW, ROW]})
    with pytest.raises(KeyError, match="no price for 'x'"):
        table.find("x")
