"""The unit-economics formulas against the seed's example and hand-computed cases."""

from __future__ import annotations

import pytest

from app.cost.model import (
    HOURS_PER_MONTH,
    RequestOverheads,
    blended_price,
    break_even,
    break_even_requests_per_month,
    cost_per_million,
    cost_per_request,
    effective_tokens_per_hour,
    gpu_hourly_cost,
    gross_margin,
)


def test_the_seeds_example_exactly() -> None:
    # seed 000 CH4-4 §8-3: $1.172/h vs $0.10 per 1M input tokens → 11.72M tok/h → ~3,255 tok/s
    got = break_even(1.172, 0.10)
    assert got.average_tokens_per_s * 3600 == pytest.approx(11_720_000)
    assert int(got.average_tokens_per_s) == 3255
    assert got.capacity_tokens_per_s == got.average_tokens_per_s


def test_each_correction_moves_it_the_seeds_way() -> None:
    base = break_even(1.172, 0.10)
    # ① utilisation 30 %: the capacity needed is ~3x (the seed's "about 10,850 tok/s")
    util = break_even(1.172, 0.10, utilisation=0.30)
    assert util.capacity_tokens_per_s == pytest.approx(10_851.85, abs=0.01)
    assert util.average_tokens_per_s == base.average_tokens_per_s
    # ② output tokens at 4x the input price, half the tokens output: lower
    out = break_even(1.172, 0.10, api_output_per_million=0.40, output_share=0.5)
    assert out.average_tokens_per_s == pytest.approx(base.average_tokens_per_s / 2.5)
    # ③ operations labour: higher
    labour = break_even(1.172, 0.10, labour_monthly=2000.0)
    assert labour.hourly_cost == pytest.approx(1.172 + 2000.0 / HOURS_PER_MONTH)
    assert labour.average_tokens_per_s > base.average_tokens_per_s


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: gpu_hourly_cost(2.0, 0.1, 0.05, 0.05), 2.2),
        (lambda: effective_tokens_per_hour(1000.0), 3_600_000.0),
        (lambda: effective_tokens_per_hour(1000.0, 0.5, 0.9), 1_620_000.0),
        (lambda: cost_per_million(2.2, 1_620_000.0), 2.2 / 1.62),
        (lambda: cost_per_request(1000, 200, 0.5, 1.5), (500 + 300) / 1e6),
        (lambda: cost_per_request(1000, 200, 0.5, 1.5, RequestOverheads(1e-5, 0, 2e-5, 1e-4)),
         (500 + 300) / 1e6 + 1.3e-4),
        (lambda: gross_margin(0.002, 0.0015), 0.0005),
        (lambda: break_even_requests_per_month(1000.0, 0.0005), 2_000_000.0),
        (lambda: blended_price(0.10, 0.40, 0.25), 0.175),
    ],
)  # fmt: skip
def test_hand_computed(call: object, expected: float) -> None:
    assert callable(call)
    assert call() == pytest.approx(expected)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: break_even_requests_per_month(100.0, 0.0), "no volume breaks even"),
        (lambda: effective_tokens_per_hour(0.0), "must be positive"),
        (lambda: effective_tokens_per_hour(10.0, utilisation=0.0), "utilisation"),
        (lambda: effective_tokens_per_hour(10.0, success_rate=1.5), "success rate"),
        (lambda: gpu_hourly_cost(-1.0), "instance"),
        (lambda: blended_price(0.1, 0.4, 1.2), "output share"),
        (lambda: break_even(1.0, 0.0), "API price"),
        (lambda: break_even(1.0, 0.1, labour_monthly=-5), "labour"),
    ],
)  # fmt: skip
def test_refusals_name_the_input(call: object, message: str) -> None:
    assert callable(call)
    with pytest.raises(ValueError, match=message):
        call()
