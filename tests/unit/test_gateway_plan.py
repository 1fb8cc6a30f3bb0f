"""Which limits apply to a caller, and the store checks they become (app/gateway/plan.py)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.gateway.plan import DAY_KEEP_S, MONTH_KEEP_S, Plan, build_plan, levels
from app.request import Caller
from app.state.protocol import BudgetCheck, ConcurrencyCheck, RateCheck
from app.state.records import KeyRecord, Limits, LimitsRecord, Principal, TenantRecord


def ts(text: str) -> float:
    """Epoch seconds of an ISO UTC timestamp."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()


NOW = ts("2026-03-15T12:34:56")
DAY_START = ts("2026-03-15T00:00:00")
MONTH_START = ts("2026-03-01T00:00:00")
SCOPE = "key:abc123abc123"

CALLER = Caller(tenant="acme", team="ml", user="alice", key_id="abc123abc123")


def key_record(limits: Limits) -> KeyRecord:
    return KeyRecord(
        id="abc123abc123",
        prefix="sk-sy-abc123abc123",
        salt="00",
        digest="00",
        tenant="acme",
        team="ml",
        user="alice",
        limits=limits,
        created_at=0.0,
    )


def principal(
    *, key: Limits | None, user: Limits | None, team: Limits | None, tenant: Limits | None
) -> Principal:
    return Principal(
        key=None if key is None else key_record(key),
        user=None if user is None else LimitsRecord(level="user", tenant="acme", name="alice",
                                                    limits=user),
        team=None if team is None else LimitsRecord(level="team", tenant="acme", name="ml",
                                                    limits=team),
        tenant=None if tenant is None else TenantRecord(id="acme", limits=tenant),
    )  # fmt: skip


# ---- levels ---------------------------------------------------------------------------

L_KEY, L_USER, L_TEAM, L_TENANT = Limits(rpm=1), Limits(rpm=2), Limits(rpm=3), Limits(rpm=4)
EMPTY = Limits()


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        pytest.param(
            {"key": L_KEY, "user": L_USER, "team": L_TEAM, "tenant": L_TENANT},
            [("key:abc123abc123", L_KEY), ("user:acme/alice", L_USER),
             ("team:acme/ml", L_TEAM), ("tenant:acme", L_TENANT)],
            id="all_levels_in_order",
        ),
        pytest.param(
            {"key": EMPTY, "user": L_USER, "team": EMPTY, "tenant": L_TENANT},
            [("user:acme/alice", L_USER), ("tenant:acme", L_TENANT)],
            id="empty_key_and_team_skipped",
        ),
        pytest.param(
            {"key": None, "user": None, "team": L_TEAM, "tenant": None},
            [("team:acme/ml", L_TEAM)],
            id="missing_records_skipped",
        ),
        pytest.param(
            {"key": EMPTY, "user": EMPTY, "team": EMPTY, "tenant": EMPTY}, [], id="all_empty"
        ),
        pytest.param({"key": None, "user": None, "team": None, "tenant": None}, [], id="none"),
        pytest.param(
            {"key": Limits(daily_usd=0.0), "user": None, "team": None, "tenant": None},
            [("key:abc123abc123", Limits(daily_usd=0.0))],
            id="zero_budget_is_a_limit",
        ),
    ],
)  # fmt: skip
def test_levels(records: dict[str, Limits | None], expected: list[tuple[str, Limits]]) -> None:
    assert levels(CALLER, principal(**records)) == expected


def test_levels_tenant_scope_is_the_callers_tenant() -> None:
    p = principal(key=None, user=None, team=None, tenant=L_TENANT)
    assert levels(Caller(tenant="globex"), p) == [("tenant:globex", L_TENANT)]


# ---- build_plan: one field at a time --------------------------------------------------

D_END = DAY_START + DAY_KEEP_S
M_END = MONTH_START + MONTH_KEEP_S


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("rpm", 60, RateCheck(f"rate:{SCOPE}:requests", "requests", 60)),
        ("tpm", 5000, RateCheck(f"rate:{SCOPE}:tokens", "tokens", 5000)),
        ("max_concurrent", 3, ConcurrencyCheck(f"conc:{SCOPE}", 3)),
        ("daily_tokens", 1000,
         BudgetCheck(f"budget:{SCOPE}:tokens:d:2026-03-15", "tokens", 1000.0, D_END)),
        ("monthly_tokens", 20000,
         BudgetCheck(f"budget:{SCOPE}:tokens:m:2026-03", "tokens", 20000.0, M_END)),
        ("daily_usd", 2.5, BudgetCheck(f"budget:{SCOPE}:usd:d:2026-03-15", "usd", 2.5, D_END)),
        ("monthly_usd", 40.0,
         BudgetCheck(f"budget:{SCOPE}:usd:m:2026-03", "usd", 40.0, M_END)),
    ],
)  # fmt: skip
def test_build_plan_maps_each_field(field: str, value: Any, expected: Any) -> None:
    assert set(Limits.model_fields) >= {field}
    plan = build_plan([(SCOPE, Limits(**{field: value}))], NOW)
    checks = [*plan.rates, *plan.concurrency, *plan.budgets]
    assert checks == [expected]
    bucket = {RateCheck: plan.rates, ConcurrencyCheck: plan.concurrency, BudgetCheck: plan.budgets}
    assert bucket[type(expected)] == (expected,)


# Read by app.fairness.bands (how a level shares a saturated model), not checks here.
SERVICE_CLASS = {"priority", "share", "raise_priority"}


def test_build_plan_covers_every_limits_field() -> None:
    """A new Limits field must show up in the table above (and in build_plan), unless
    it is a service-class field (app.fairness.bands)."""
    limits = Limits(
        rpm=1, tpm=1, max_concurrent=1, daily_tokens=1, monthly_tokens=1, daily_usd=1,
        monthly_usd=1,
    )  # fmt: skip
    checked = {k: v for k, v in limits.model_dump().items() if k not in SERVICE_CLASS}
    assert len(checked) == 7 and all(v is not None for v in checked.values())
    plan = build_plan([(SCOPE, limits)], NOW)
    assert (len(plan.rates), len(plan.concurrency), len(plan.budgets)) == (2, 1, 4)


def test_build_plan_keeps_scope_order_and_separates_scopes() -> None:
    scoped = [("key:k", Limits(rpm=1, daily_tokens=10)), ("tenant:acme", Limits(rpm=2))]
    plan = build_plan(scoped, NOW)
    assert plan.rates == (
        RateCheck("rate:key:k:requests", "requests", 1),
        RateCheck("rate:tenant:acme:requests", "requests", 2),
    )
    assert [b.key for b in plan.budgets] == ["budget:key:k:tokens:d:2026-03-15"]
    assert plan.concurrency == ()


def test_build_plan_of_nothing_is_empty() -> None:
    assert build_plan([], NOW) == Plan()


# ---- period keys ----------------------------------------------------------------------


@pytest.fixture(params=["UTC", "Pacific/Kiritimati", "America/Anchorage"])
def local_tz(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Periods are UTC whatever the process's local time zone."""
    monkeypatch.setenv("TZ", request.param)
    time.tzset()
    yield request.param
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("moment", "day", "month", "day_start", "month_start"),
    [
        ("2026-03-15T12:34:56", "2026-03-15", "2026-03", "2026-03-15", "2026-03-01"),
        ("2026-03-15T23:59:59.999", "2026-03-15", "2026-03", "2026-03-15", "2026-03-01"),
        ("2026-03-16T00:00:00", "2026-03-16", "2026-03", "2026-03-16", "2026-03-01"),
        ("2026-01-31T23:59:59.5", "2026-01-31", "2026-01", "2026-01-31", "2026-01-01"),
        ("2026-02-01T00:00:00", "2026-02-01", "2026-02", "2026-02-01", "2026-02-01"),
        ("2024-02-29T23:59:59", "2024-02-29", "2024-02", "2024-02-29", "2024-02-01"),
        ("2025-12-31T23:59:59.999", "2025-12-31", "2025-12", "2025-12-31", "2025-12-01"),
        ("2026-01-01T00:00:00.001", "2026-01-01", "2026-01", "2026-01-01", "2026-01-01"),
    ],
)
def test_period_keys_are_utc(
    local_tz: str, moment: str, day: str, month: str, day_start: str, month_start: str
) -> None:
    limits = Limits(daily_tokens=1, monthly_tokens=1, daily_usd=1, monthly_usd=1)
    plan = build_plan([("tenant:acme", limits)], ts(moment))
    d_end = ts(f"{day_start}T00:00:00") + DAY_KEEP_S
    m_end = ts(f"{month_start}T00:00:00") + MONTH_KEEP_S
    assert [(b.key, b.expires_at) for b in plan.budgets] == [
        (f"budget:tenant:acme:tokens:d:{day}", d_end),
        (f"budget:tenant:acme:tokens:m:{month}", m_end),
        (f"budget:tenant:acme:usd:d:{day}", d_end),
        (f"budget:tenant:acme:usd:m:{month}", m_end),
    ]


def test_counters_outlive_their_period() -> None:
    plan = build_plan([("t", Limits(daily_tokens=1, monthly_tokens=1))], ts("2026-01-31T23:59:59"))
    daily, monthly = plan.budgets
    assert daily.expires_at > ts("2026-02-01T00:00:00")  # the day is over before it is dropped
    assert monthly.expires_at > ts("2026-02-01T00:00:00")  # a 31-day month too


# ---- margin_tokens --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("margin", "daily_tokens", "monthly_tokens"),
    [(0, 1000.0, 50.0), (100, 900.0, 0.0), (1000, 0.0, 0.0), (2000, 0.0, 0.0)],
)
def test_margin_tokens_only_reduces_token_budgets(
    margin: int, daily_tokens: float, monthly_tokens: float
) -> None:
    limits = Limits(
        rpm=10, tpm=1000, max_concurrent=2, daily_tokens=1000, monthly_tokens=50,
        daily_usd=5.0, monthly_usd=3.0,
    )  # fmt: skip
    plan = build_plan([("tenant:acme", limits)], NOW, margin_tokens=margin)
    assert [(b.unit, b.limit) for b in plan.budgets] == [
        ("tokens", daily_tokens),
        ("tokens", monthly_tokens),
        ("usd", 5.0),
        ("usd", 3.0),
    ]
    assert [r.limit for r in plan.rates] == [10, 1000]
    assert [c.limit for c in plan.concurrency] == [2]


# ---- Plan properties ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "needs_prompt_tokens", "empty"),
    [
        (Limits(), False, True),
        (Limits(rpm=5), False, False),
        (Limits(max_concurrent=2), False, False),
        (Limits(rpm=5, max_concurrent=2), False, False),
        (Limits(tpm=100), True, False),
        (Limits(daily_tokens=100), True, False),
        (Limits(monthly_usd=1.0), True, False),
        (Limits(rpm=5, daily_usd=0.0), True, False),
    ],
)
def test_plan_properties(limits: Limits, needs_prompt_tokens: bool, empty: bool) -> None:
    plan = build_plan([("tenant:acme", limits)], NOW)
    assert plan.needs_prompt_tokens is needs_prompt_tokens
    assert plan.empty is empty
