"""The capacity plan's rule (``app.cost.plan``), hand-computed."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from app.cost.mix import Mix, Objective, WorkloadClass
from app.cost.model import HOURS_PER_MONTH
from app.cost.plan import (
    Curve,
    MeasuredPoint,
    PlanRefused,
    Pricing,
    plan,
    plan_class,
    select_hardware,
    size,
)
from app.cost.queueing import max_rate

SLO = Objective(ttft_p95_ms=1000, itl_p95_ms=100)


def point(
    value: int,
    c: int,
    goodput: float,
    ttft: float = 500,
    itl: float = 50,
    e2e: float = 4000,
    errors: float = 0.0,
    deployable: bool = True,
) -> MeasuredPoint:
    p95s: dict[str, float | None] = {"ttft": ttft, "itl": itl, "e2e": e2e}
    return MeasuredPoint(value, c, goodput, errors, p95s, deployable)


def curve(
    profile: str,
    *points: MeasuredPoint,
    hardware: str = "cpu-a",
    tokens: int = 64,
    slo: Objective = SLO,
) -> Curve:
    source = f"{profile}.json"
    return Curve(source, profile, hardware, "max_num_seqs", tokens, tokens // 2, 0.01, slo, points)


def chat(share: float = 1.0, **kw: object) -> WorkloadClass:
    return WorkloadClass.model_validate({"name": "chat", "share": share, **kw})


# rps, goodput, pricing → replicas needed, replicas, GPUs, $/month, utilisation
SIZES = [
    (1.6, 0.4, Pricing(0.10), 4, 5, 5, 5 * 0.10 * 730, 1.0),
    (2.1, 0.7, Pricing(1.0), 3, 4, 4, 4 * 730.0, 1.0),  # 2.1/0.7 = 3.0000000000000004: 3
    (1.0, 0.3, Pricing(2.0, gpus_per_replica=2), 4, 5, 10, 10 * 2.0 * 730, 1.0 / 1.2),
    (0.1, 0.9, Pricing(1.0), 1, 2, 2, 2 * 730.0, 0.1 / 0.9),  # low traffic: one + the spare
    (2.0, 1.0, Pricing(1.0, spare_replicas=0), 2, 2, 2, 2 * 730.0, 1.0),
    (0.5, 0.25, Pricing(0.5, spare_replicas=2), 2, 4, 4, 4 * 0.5 * 730, 1.0),
    (0.9, 0.25, Pricing(1.0), 4, 5, 5, 5 * 730.0, 0.9),
]


@pytest.mark.parametrize(
    ("rps", "goodput", "pricing", "needed", "replicas", "gpus", "cost", "util"), SIZES
)
def test_replicas_gpus_cost_and_utilisation(
    rps: float,
    goodput: float,
    pricing: Pricing,
    needed: int,
    replicas: int,
    gpus: int,
    cost: float,
    util: float,
) -> None:
    p = point(4, 2, goodput)
    got = size(curve("interactive", p), p, rps, pricing, SLO)
    assert (got.replicas_needed, got.replicas, got.gpus) == (needed, replicas, gpus)
    assert got.monthly_cost == pytest.approx(cost)
    assert got.utilisation == pytest.approx(util)
    assert HOURS_PER_MONTH == 730.0


def test_the_cheapest_point_meeting_the_slo_wins_and_every_candidate_is_listed() -> None:
    fast = curve("interactive", point(4, 1, 0.25), point(4, 2, 0.40), point(4, 4, 0.9, itl=300))
    bulk = curve("throughput", point(16, 16, 2.0, ttft=5000), point(16, 1, 5.0, deployable=False))
    got = plan_class(chat(), 1.0, SLO, [fast, bulk], Pricing(0.10))
    # 1.0/0.40 → 3 (+1) beats 1.0/0.25 → 4 (+1); c=4 breaks ITL, c=16 TTFT, c=1 of
    # the throughput curve is not deployable.
    assert (got.chosen.concurrency, got.chosen.replicas) == (2, 4)
    assert got.chosen.monthly_cost == pytest.approx(4 * 0.10 * 730)
    assert got.chosen.utilisation == pytest.approx(1.0 / 1.2)
    assert [c.concurrency for c in got.candidates] == [2, 1]
    assert len(got.rejected) == 3
    assert any("ITL p95 300 ms > 100 ms" in r for r in got.rejected)
    assert any("TTFT p95 5000 ms > 1000 ms" in r for r in got.rejected)
    assert any("not deployable as throughput" in r for r in got.rejected)


def test_equal_cost_goes_to_a_goodput_counted_under_a_strict_enough_slo() -> None:
    loose = curve("throughput", point(16, 16, 0.6), slo=Objective(e2e_p95_ms=60000))
    strict = curve("interactive", point(4, 4, 0.5))
    got = plan_class(chat(), 0.4, SLO, [loose, strict], Pricing(1.0))
    # both need 1 (+1) replica; the throughput curve's goodput counted E2E only
    assert [c.profile for c in got.candidates] == ["interactive", "throughput"]
    assert [c.conservative for c in got.candidates] == [True, False]


def test_error_budget_is_the_reports_own() -> None:
    c = curve("interactive", point(4, 2, 0.4, errors=0.02), point(4, 1, 0.2, errors=0.01))
    got = plan_class(chat(), 0.2, SLO, [c], Pricing(1.0))
    assert got.chosen.concurrency == 1
    assert "error rate 2.0% > 1.0%" in got.rejected[0]


def test_a_class_uses_only_its_profiles_and_curves_measured_with_enough_tokens() -> None:
    inter, thr = curve("interactive", point(4, 2, 0.4)), curve("throughput", point(16, 16, 1.0))
    got = plan_class(chat(profiles=["throughput"]), 1.0, SLO, [inter, thr], Pricing(1.0))
    assert got.chosen.profile == "throughput"
    assert got.not_covering == ("interactive.json: profile interactive is not in ['throughput']",)
    long = plan_class(
        chat(input_tokens=128),
        1.0,
        SLO,
        [inter, curve("x", point(1, 1, 1.0), tokens=256)],
        Pricing(1.0),
    )
    assert long.chosen.source == "x.json"
    assert long.not_covering == (
        "interactive.json: measured at 64 input tokens, the class has 128",
    )


def test_the_plan_sums_its_classes_and_a_class_slo_overrides_the_plans() -> None:
    inter = curve("interactive", point(4, 2, 0.4, e2e=5000))
    thr = curve(
        "throughput",
        point(16, 16, 0.9, ttft=8000, itl=800, e2e=20000),
        slo=Objective(e2e_p95_ms=60000),
    )
    mix = Mix.model_validate({"classes": [
        {"name": "chat", "share": 0.8},
        {"name": "batch", "share": 0.2, "slo": {"e2e_p95_ms": 60000}, "profiles": ["throughput"]},
    ]})  # fmt: skip
    got = plan(2.0, mix, SLO, [inter, thr], Pricing(0.10))
    chat_plan, batch = got.classes
    assert (chat_plan.rps, chat_plan.chosen.replicas) == (pytest.approx(1.6), 5)  # 4 + 1
    assert (batch.rps, batch.chosen.replicas) == (pytest.approx(0.4), 2)  # 1 + 1
    assert batch.chosen.utilisation == pytest.approx(0.4 / 0.9)
    assert (got.replicas, got.gpus) == (7, 7)
    assert got.monthly_cost == pytest.approx(7 * 0.10 * 730)
    assert got.utilisation == pytest.approx(2.0 / (4 * 0.4 + 1 * 0.9))


def test_no_point_meeting_the_slo_is_refused_naming_the_class_slo_and_nearest_point() -> None:
    c = curve("interactive", point(4, 1, 0.2, ttft=800), point(4, 2, 0.4, ttft=900, itl=400))
    with pytest.raises(PlanRefused) as err:
        plan_class(chat(), 1.0, Objective(ttft_p95_ms=500), [c], Pricing(1.0))
    msg = str(err.value)
    assert msg.startswith("class 'chat': no measured point meets ttft_p95_ms=500;")
    assert "nearest measured point: interactive max_num_seqs=4 concurrency 1" in msg
    assert "TTFT p95 800 ms" in msg


def test_no_covering_curve_is_refused_with_the_reasons() -> None:
    c = curve("interactive", point(4, 1, 0.2))
    with pytest.raises(
        PlanRefused,
        match=r"no profile report covers it \(interactive.json: "
        r"profile interactive is not in \['long_context'\]\)",
    ):
        plan_class(chat(profiles=["long_context"]), 1.0, SLO, [c], Pricing(1.0))


@pytest.mark.parametrize(("wanted", "kept", "message"), [
    (None, None, "span hardware classes cpu-a, gpu-b: pick one with --hardware"),
    ("CPU", ["interactive.json"], None),
    ("h100", None, "no profile report was measured on hardware 'h100'; the reports' "
                   "hardware: cpu-a, gpu-b"),
])  # fmt: skip
def test_hardware_filter(wanted: str | None, kept: list[str] | None, message: str | None) -> None:
    curves = [
        curve("interactive", point(4, 1, 0.2)),
        curve("throughput", point(16, 16, 1.0), hardware="gpu-b"),
    ]
    if message is not None:
        with pytest.raises(PlanRefused, match=message):
            select_hardware(curves, wanted)
        return
    got, left = select_hardware(curves, wanted)
    assert [c.source for c in got] == kept and left == ["throughput.json (gpu-b)"]


@pytest.mark.parametrize(("raw", "problem"), [
    ({"classes": [{"name": "a", "share": 0.5}]}, "shares sum to 0.5, not 1"),
    ({"classes": [{"name": "a", "share": 0.5}, {"name": "a", "share": 0.5}]}, "names repeat"),
    ({"classes": [{"name": "a", "share": 1, "weight": 2}]}, "Extra inputs are not permitted"),
    ({"classes": [{"name": "a", "share": 1}], "rps": 3}, "Extra inputs are not permitted"),
    ({"classes": [{"name": "a", "share": 1, "slo": {}}]}, "at least one of"),
    ({"classes": []}, "at least 1 item"),
])  # fmt: skip
def test_the_mix_file_is_validated(raw: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Mix.model_validate(raw)


def test_a_rate_of_zero_is_refused() -> None:
    mix = Mix.model_validate({"classes": [{"name": "a", "share": 1}]})
    with pytest.raises(PlanRefused, match="above 0"):
        plan(0.0, mix, SLO, [], Pricing(1.0))


def _queued(c: int, goodput: float, service_s: float, ttft: float = 500) -> MeasuredPoint:
    p95s: dict[str, float | None] = {"ttft": ttft, "itl": 50, "e2e": 4000}
    return MeasuredPoint(4, c, goodput, 0.0, p95s, True, service_s)


@pytest.mark.parametrize(
    ("c", "goodput", "service_s", "capped"),
    [
        (2, 0.40, 4.0, True),  # long requests, 2 slots: random arrivals wait too long
        (16, 0.50, 0.5, False),  # many slots, short requests: goodput is the limit
    ],
)
def test_capacity_is_the_lower_of_goodput_and_the_poisson_rate_within_the_slo(
    c: int, goodput: float, service_s: float, capped: bool
) -> None:
    p = _queued(c, goodput, service_s)
    got = size(curve("interactive", p), p, 1.0, Pricing(1.0), SLO)
    expected_q = max_rate(c, service_s, (1000 - 500) / 1000)
    assert got.queue_rate == pytest.approx(expected_q)
    assert got.capacity == pytest.approx(min(goodput, expected_q))
    assert (got.capacity < goodput) is capped
    assert got.replicas_needed == math.ceil(1.0 / got.capacity)
    assert got.utilisation == pytest.approx(1.0 / (got.replicas_needed * goodput))


def test_a_point_with_no_room_to_wait_is_no_candidate() -> None:
    edge = _queued(2, 0.4, 4.0, ttft=1000)  # its p95 TTFT is the limit: no wait allowed
    ok = _queued(4, 0.4, 4.0)
    got = plan_class(chat(), 0.1, SLO, [curve("interactive", edge, ok)], Pricing(1.0))
    assert got.chosen.concurrency == 4
    assert any("no room to wait within the SLO" in r for r in got.rejected)
