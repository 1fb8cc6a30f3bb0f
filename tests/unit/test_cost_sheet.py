"""The cost sheet's unit costs, break-even rows and scenario table, hand-computed."""

from __future__ import annotations

import pytest

from app.cost.model import HOURS_PER_MONTH
from app.cost.prices import parse_prices
from app.cost.scenarios import HiddenCosts, Instance
from app.cost.sheet import SheetInputs, Throughput, WorkloadClass, per_class, sheet, unit_costs

T = Throughput(
    input_tokens_per_s=800.0,
    output_tokens_per_s=200.0,
    requests_per_s=10.0,
    success_rate=1.0,
    input_tokens_per_request=80.0,
    output_tokens_per_request=20.0,
)
PRICES = parse_prices(
    {
        "rows": [
            {
                "provider": "p",
                "model": "m",
                "input_per_1m": 0.10,
                "output_per_1m": 0.40,
                "date": "2026-06-01",
                "source": "x",
            }
        ]
    }
)


def test_unit_costs_split_by_the_input_weight() -> None:
    got = unit_costs(T, SheetInputs(hourly=3.6, input_weight=0.25))
    assert got["effective_input_tokens_per_hour"] == pytest.approx(800 * 3600)
    assert got["per_1m_tokens"] == pytest.approx(3.6 / (1000 * 3600) * 1e6)  # $1.00
    # weighted tokens/hour: 0.25 × 2.88M + 0.72M = 1.44M → output $2.50/1M, input $0.625/1M
    assert got["per_1m_output"] == pytest.approx(2.5)
    assert got["per_1m_input"] == pytest.approx(0.625)
    # the whole hour is paid for: the split re-adds to the hourly cost
    hour = got["per_1m_input"] * 2.88 + got["per_1m_output"] * 0.72
    assert hour == pytest.approx(3.6)
    assert got["per_request"] == pytest.approx((80 * 0.625 + 20 * 2.5) / 1e6)
    half = unit_costs(T, SheetInputs(hourly=3.6, utilisation=0.5))
    assert half["per_1m_tokens"] == pytest.approx(2 * got["per_1m_tokens"])


def test_each_workload_class_is_priced_at_its_own_tokens() -> None:
    units = unit_costs(T, SheetInputs(hourly=3.6, input_weight=0.25))  # $0.625 / $2.50
    classes = [WorkloadClass("chat", 10, 1.0, 80, 20), WorkloadClass("rag", 5, 0.8, 2000, 50)]
    chat, rag = per_class(classes, units, None)
    assert chat["per_request"] == pytest.approx(units["per_request"])  # the run's average
    assert rag["per_request"] == pytest.approx((2000 * 0.625 + 50 * 2.5) / 1e6)
    (retried,) = per_class(classes[:1], units, 0.1)
    assert retried["per_request"] == pytest.approx(1.1 * chat["per_request"])


def test_break_even_and_scenarios() -> None:
    s = SheetInputs(hourly=1.0, utilisation=0.5, labour_monthly=HOURS_PER_MONTH)  # +$1/h
    out = sheet(
        T,
        s,
        PRICES,
        [Instance("gpu", 1.0, 10.0)],
        {"low": 1e6},
        {"base": HiddenCosts()},
        revenue_per_request=1e-4,
    )
    row = out["break_even"][0]
    assert row["api_per_1m_blended"] == pytest.approx(0.10 * 0.8 + 0.40 * 0.2)  # $0.16
    assert row["break_even_avg_tokens_per_s"] == pytest.approx(2.0 / 0.16 * 1e6 / 3600)
    assert row["break_even_capacity_tokens_per_s"] == pytest.approx(
        row["break_even_avg_tokens_per_s"] / 0.5
    )
    assert row["reachable"] is False  # 1,000 tok/s measured < ~6,944 needed
    kinds = {(r["traffic"], r["case"], r["scenario"]) for r in out["monthly"]}
    assert kinds == {("low", "base", "gpu"), ("low", "base", "API p/m")}
    assert out["price_dates"] == ["2026-06-01"]
    assert len(out["curve"]["per_1m_tokens"]) == len(out["curve"]["utilisation"])
