"""The §11.4 scenarios, hand-computed."""

from __future__ import annotations

import datetime as dt

import pytest

from app.cost.model import HOURS_PER_MONTH
from app.cost.prices import PriceRow
from app.cost.scenarios import SECONDS_PER_MONTH, HiddenCosts, Instance, Workload, api, self_served

ROW = PriceRow(provider="p", model="m", input_per_1m=1.0, output_per_1m=4.0,
               cached_input_per_1m=0.1, date=dt.date(2026, 6, 1), source="x")  # fmt: skip
NONE = HiddenCosts(max_utilisation=1.0, spare_instances=0, redeploy_hours=0, retry_rate=0)


def test_instances_cover_the_average_at_the_planned_utilisation_plus_spares() -> None:
    gpu = Instance("one big GPU", hourly=2.0, capacity_rps=10.0)
    requests = 15.0 * SECONDS_PER_MONTH  # 15 req/s on average
    bare = self_served(gpu, requests, NONE)
    assert (bare.instances, bare.utilisation) == (2, pytest.approx(0.75))
    assert bare.cost == pytest.approx(2 * 2.0 * HOURS_PER_MONTH)
    hidden = HiddenCosts(max_utilisation=0.5, spare_instances=1, redeploy_hours=10, retry_rate=0.1,
                         reask_rate=0.1, observability_monthly=50, labour_monthly=1000)  # fmt: skip
    got = self_served(gpu, requests, hidden, revenue_per_request=1e-4)
    assert got.served == pytest.approx(requests * 1.2)
    assert got.instances == 4 + 1  # 18 req/s / (10 × 0.5) → 4, plus one spare
    assert got.utilisation == pytest.approx(18 / 50)
    assert got.cost == pytest.approx(5 * 2.0 * (HOURS_PER_MONTH + 10) + 50 + 1000)
    assert got.margin == pytest.approx(1e-4 * requests - got.cost)


def test_low_traffic_still_pays_the_minimum() -> None:
    got = self_served(Instance("x", 1.0, 100.0), 1000.0, NONE)
    assert got.instances == 1 and got.utilisation == pytest.approx(1000 / SECONDS_PER_MONTH / 100)


def test_the_api_bills_every_served_token_with_the_cached_share() -> None:
    work = Workload(input_tokens=1000, output_tokens=100, cached_share=0.5)
    got = api(ROW, work, 1_000_000, HiddenCosts(retry_rate=0.0, labour_api_monthly=10))
    per = (500 * 1.0 + 500 * 0.1 + 100 * 4.0) / 1e6
    assert got.cost == pytest.approx(1_000_000 * per + 10)
    no_cache = ROW.model_copy(update={"cached_input_per_1m": None})
    assert api(no_cache, work, 1, NONE).cost == pytest.approx((1000 * 1.0 + 400) / 1e6)


def test_a_zero_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity must be positive"):
        self_served(Instance("x", 1.0, 0.0), 1.0, NONE)
