"""The gate (app/gateway/admission.py) over a real SqliteStore: admission, refusal and its
headers, exactly-once settlement and billing, store-failure policy, the heartbeat."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from app.config import GatewayArgs
from app.gateway.admission import Admission, Gate, Outcome, Refused, rate_headers
from app.gateway.plan import Caller, Plan, build_plan
from app.state.protocol import (
    AdmitRequest,
    LedgerQuery,
    Price,
    RateState,
    StateStore,
    StoreUnavailable,
)
from app.state.records import LedgerRecord, Limits
from app.state.sqlite_store import SqliteStore

CALLER = Caller(tenant="acme", team="ml", user="alice", key_id="abc123abc123")
SCOPE = "tenant:acme"


def plan(**limits: Any) -> Plan:
    return build_plan([(SCOPE, Limits(**limits))], time.time())


def outcome(
    prompt: int, completion: int, cached: int = 0, status: Any = "ok", http: int = 200
) -> Outcome:
    return Outcome(
        endpoint="/v1/chat/completions",
        status=status,
        http_status=http,
        model_served="m-served",
        pool="LLMServer-m",
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        ttft_s=0.01,
    )


class SwitchableStore:
    """Wraps a SqliteStore; ``mode`` "raise" fails every call, "hang" never answers.
    Counts the calls per method."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.mode = "up"
        self.calls: list[str] = []
        self.settle_delay_s = 0.0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if self.mode == "raise":
                raise StoreUnavailable("switched off")
            if self.mode == "hang":
                await asyncio.sleep(30)
            if name == "settle" and self.settle_delay_s:
                await asyncio.sleep(self.settle_delay_s)
            return await target(*args, **kwargs)

        return call


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "s.db")
    yield s
    await s.close()


@pytest.fixture
def wrapped(store: SqliteStore) -> SwitchableStore:
    return SwitchableStore(store)


class Harness:
    def __init__(self, store: StateStore, args: GatewayArgs) -> None:
        self.settled: list[LedgerRecord] = []
        self.failures: list[str] = []
        self.gate = Gate(
            store,
            args,
            replica="ingress-0",
            on_settled=self.settled.append,
            on_failure=self.failures.append,
        )

    async def admit(
        self,
        p: Plan,
        *,
        prompt: int = 100,
        requested: int | None = 500,
        context_left: int = 4000,
        price: Price | None = None,
    ) -> Admission:
        return await self.gate.admit(
            CALLER, p, model="m", prompt_tokens=prompt, requested_max_tokens=requested,
            context_left=context_left, price=price or Price(), session_id="sess-1",
        )  # fmt: skip


def harness(store: Any, **args: Any) -> Harness:
    return Harness(cast(StateStore, store), GatewayArgs(**args))


async def ledger(store: SqliteStore) -> list[LedgerRecord]:
    return await store.query_ledger(LedgerQuery())


# ---- admission ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "context_left", "allowance", "max_tokens"),
    [(500, 4000, 500, 500), (None, 4000, 4000, None), (0, 4000, 0, 0), (None, -5, 0, None)],
)
async def test_empty_plan_never_touches_the_store(
    wrapped: SwitchableStore,
    requested: int | None,
    context_left: int,
    allowance: int,
    max_tokens: int | None,
) -> None:
    h = harness(wrapped)
    a = await h.admit(Plan(), requested=requested, context_left=context_left)
    assert wrapped.calls == []
    assert a.result.admitted and a.result.allowance == allowance
    assert a.max_tokens == max_tokens
    assert a.capped is False
    assert a.headers() == {}
    assert a.local is False


@pytest.mark.parametrize(
    ("limits", "prompt", "requested", "price", "allowance", "capped"),
    [
        ({"daily_tokens": 1000}, 100, 2000, Price(), 900, True),
        ({"daily_tokens": 1000}, 100, 900, Price(), 900, False),
        ({"daily_tokens": 1000}, 100, 500, Price(), 500, False),
        ({"daily_tokens": 1000}, 100, None, Price(), 900, True),
        ({"daily_tokens": 1000, "monthly_tokens": 300}, 100, 2000, Price(), 200, True),
        ({"daily_usd": 100.0}, 40, 2000, Price(input=0.5, output=0.25), 320, True),
        ({"daily_usd": 100.0}, 40, 100, Price(input=0.5, output=0.25), 100, False),
        ({"rpm": 10, "daily_tokens": 1000}, 100, 2000, Price(), 900, True),
    ],
)
async def test_budget_caps_the_allowance(
    store: SqliteStore,
    limits: dict[str, Any],
    prompt: int,
    requested: int | None,
    price: Price,
    allowance: int,
    capped: bool,
) -> None:
    h = harness(store)
    a = await h.admit(plan(**limits), prompt=prompt, requested=requested, price=price)
    assert a.result.allowance == allowance
    assert a.max_tokens == allowance
    assert a.capped is capped
    assert a.result.reserved_tokens == prompt + allowance


async def test_rate_limits_without_budget_pass_max_tokens_through(store: SqliteStore) -> None:
    h = harness(store)
    a = await h.admit(plan(rpm=10, tpm=10_000), prompt=100, requested=None, context_left=400)
    assert a.max_tokens is None and a.capped is False
    assert a.result.allowance == 400
    assert a.headers() == {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-reset-requests": "6s",
        "x-ratelimit-limit-tokens": "10000",
        "x-ratelimit-remaining-tokens": "9500",
        "x-ratelimit-reset-tokens": "3s",
    }


# (id, limits, admit first, prompt, requested, reason, Retry-After, x-ratelimit headers)
Refusal = tuple[str, dict[str, Any], bool, int, int | None, str, str | None, dict[str, str]]
REFUSALS: list[Refusal] = [
    ("rpm", {"rpm": 1}, True, 10, 10, "requests", "60",
     {"x-ratelimit-limit-requests": "1", "x-ratelimit-remaining-requests": "0",
      "x-ratelimit-reset-requests": "1m0s"}),
    ("tpm", {"tpm": 100}, False, 50, 100, "tokens", "60",
     {"x-ratelimit-limit-tokens": "100", "x-ratelimit-remaining-tokens": "100",
      "x-ratelimit-reset-tokens": "0ms"}),
    ("concurrency", {"max_concurrent": 1}, True, 10, 10, "concurrency", "1", {}),
    ("budget", {"daily_tokens": 100}, False, 90, 50, "budget", None, {}),
    ("budget_exhausted", {"daily_tokens": 100}, True, 50, 50, "budget", None, {}),
    ("budget_context_left", {"daily_tokens": 100}, False, 90, None, "budget", None, {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("limits", "first", "prompt", "requested", "reason", "retry_after", "rate"),
    [c[1:] for c in REFUSALS],
    ids=[c[0] for c in REFUSALS],
)
async def test_refused(
    store: SqliteStore,
    limits: dict[str, Any],
    first: bool,
    prompt: int,
    requested: int | None,
    reason: str,
    retry_after: str | None,
    rate: dict[str, str],
) -> None:
    h = harness(store)
    p = plan(**limits)
    if first:
        await h.admit(p, prompt=prompt, requested=requested)
    with pytest.raises(Refused) as info:
        await h.admit(p, prompt=prompt, requested=requested, context_left=1000)
    refused = info.value
    assert refused.reason == reason
    assert refused.message()
    expected = dict(rate)
    if retry_after is not None:
        expected["Retry-After"] = retry_after
        assert refused.retry_after_s > 0
    else:
        assert refused.retry_after_s == 0
    assert refused.headers == expected


@pytest.mark.parametrize(
    ("min_output", "requested", "admitted_with"),
    [
        (16, 50, None),  # 10 tokens left < 16
        (16, 8, 8),  # asked for less than the minimum, and it fits
        (16, 10, 10),
        (10, 50, 10),  # exactly the minimum left
        (11, 50, None),
        (1, None, 10),
    ],
)
async def test_min_output_tokens(
    store: SqliteStore, min_output: int, requested: int | None, admitted_with: int | None
) -> None:
    h = harness(store, min_output_tokens=min_output)
    p = plan(daily_tokens=100)
    if admitted_with is None:
        with pytest.raises(Refused) as info:
            await h.admit(p, prompt=90, requested=requested)
        assert info.value.reason == "budget"
    else:
        a = await h.admit(p, prompt=90, requested=requested)
        assert a.max_tokens == admitted_with


async def test_refused_request_holds_nothing(store: SqliteStore) -> None:
    h = harness(store)
    p = plan(daily_tokens=100, max_concurrent=1)
    with pytest.raises(Refused):
        await h.admit(p, prompt=95, requested=50)
    assert await store.budget_used(p.budgets[0].key) == (0.0, 0.0)
    a = await h.admit(p, prompt=10, requested=50)  # the concurrency slot is free
    assert a.max_tokens == 50


# ---- settlement -----------------------------------------------------------------------

M = 1e-6


@pytest.mark.parametrize(
    ("price", "prompt", "cached", "completion", "cost"),
    [
        (Price(), 1000, 400, 50, 0.0),
        (Price(input=2 * M, output=8 * M, cached_input=0.5 * M), 1000, 400, 50, 0.0018),
        (Price(input=2 * M, output=8 * M, cached_input=0.5 * M), 1000, 0, 50, 0.0024),
        (Price(input=2 * M, output=8 * M, cached_input=2 * M), 1000, 1000, 0, 0.002),
        (Price(input=3 * M, output=15 * M, cached_input=0.3 * M), 10, 0, 0, 0.00003),
        (Price(input=3 * M, output=15 * M, cached_input=0.3 * M), 0, 0, 200, 0.003),
        (Price(input=1.0, output=2.0, cached_input=0.25), 8, 4, 3, 11.0),
        (Price(input=1.0, output=2.0, cached_input=0.25), 4, 8, 0, 2.0),  # cached > prompt
    ],
)
async def test_settle_writes_one_priced_record(
    store: SqliteStore, price: Price, prompt: int, cached: int, completion: int, cost: float
) -> None:
    h = harness(store)
    a = await h.admit(Plan(), prompt=prompt, requested=completion, price=price)
    o = outcome(prompt, completion, cached)
    h.gate.settle(a, o)
    h.gate.settle(a, o)  # a second settle is a no-op
    await h.gate.drain()
    records = await ledger(store)
    assert len(records) == 1
    r = records[0]
    assert r.cost_usd == pytest.approx(cost, rel=1e-12, abs=1e-15)
    assert r.model_dump(
        include={"request_id", "session_id", "tenant", "team", "user", "key_id",
                 "model_requested", "model_served", "pool", "endpoint", "status",
                 "http_status", "prompt_tokens", "completion_tokens", "cached_tokens",
                 "ingress"}
    ) == {
        "request_id": a.request.request_id, "session_id": "sess-1", "tenant": "acme",
        "team": "ml", "user": "alice", "key_id": "abc123abc123", "model_requested": "m",
        "model_served": "m-served", "pool": "LLMServer-m", "endpoint": "/v1/chat/completions",
        "status": "ok", "http_status": 200, "prompt_tokens": prompt,
        "completion_tokens": completion, "cached_tokens": cached, "ingress": "ingress-0",
    }  # fmt: skip
    assert r.started_at <= r.ended_at and r.e2e_s >= 0
    assert h.settled == [r]


async def test_settle_twice_with_different_outcomes_bills_the_first(store: SqliteStore) -> None:
    h = harness(store)
    p = plan(daily_tokens=10_000)
    a = await h.admit(p, prompt=100, requested=500)
    h.gate.settle(a, outcome(100, 20))
    h.gate.settle(a, outcome(100, 400, status="error", http=500))
    await h.gate.drain()
    assert [r.completion_tokens for r in await ledger(store)] == [20]
    assert await store.budget_used(p.budgets[0].key) == (120.0, 0.0)
    assert len(h.settled) == 1


@pytest.mark.parametrize(
    ("o", "used"),
    [
        (outcome(100, 3, status="client_closed", http=499), 103.0),
        (outcome(100, 500), 600.0),
        (outcome(0, 0, status="rejected_by_engine", http=400), 0.0),
        (outcome(100, 0, status="error", http=500), 100.0),
    ],
)
async def test_settle_bills_actual_usage_and_releases_the_rest(
    store: SqliteStore, o: Outcome, used: float
) -> None:
    h = harness(store)
    p = plan(daily_tokens=10_000, monthly_tokens=100_000, tpm=1000)
    a = await h.admit(p, prompt=100, requested=500)
    for b in p.budgets:
        assert await store.budget_used(b.key) == (0.0, 600.0)
    h.gate.settle(a, o)
    await h.gate.drain()
    for b in p.budgets:
        assert await store.budget_used(b.key) == (used, 0.0)
    # the unused token units went back to the per-minute bucket
    nxt = await h.admit(p, prompt=1, requested=1)
    remaining = int(nxt.headers()["x-ratelimit-remaining-tokens"])
    assert 1000 - used - 2 <= remaining <= 1000 - used - 2 + 20  # + refill meanwhile


async def test_settle_after_budget_cap_bills_the_rest_of_the_budget(store: SqliteStore) -> None:
    h = harness(store)
    p = plan(daily_tokens=1000)
    a = await h.admit(p, prompt=100, requested=5000)
    assert a.max_tokens == 900
    h.gate.settle(a, outcome(100, 900))
    await h.gate.drain()
    with pytest.raises(Refused) as info:
        await h.admit(p, prompt=1, requested=10)
    assert info.value.reason == "budget"


async def test_drain_waits_for_settlements(store: SqliteStore, wrapped: SwitchableStore) -> None:
    wrapped.settle_delay_s = 0.1
    h = harness(wrapped)
    admissions = [await h.admit(plan(rpm=100)) for _ in range(3)]
    for a in admissions:
        h.gate.settle(a, outcome(100, 1))
    await asyncio.sleep(0)
    assert h.settled == [] and await ledger(store) == []
    await h.gate.drain()
    assert len(h.settled) == 3
    assert {r.request_id for r in await ledger(store)} == {a.request.request_id for a in admissions}


async def test_drain_without_settlements_returns(store: SqliteStore) -> None:
    await asyncio.wait_for(harness(store).gate.drain(), 1.0)


# ---- rate headers ---------------------------------------------------------------------


def rs(kind: Any, limit: int, remaining: int, reset: float) -> RateState:
    return RateState(kind, limit, remaining, reset)


@pytest.mark.parametrize(
    ("reset", "text"),
    [
        (0.0, "0ms"),
        (0.12, "120ms"),
        (0.5, "500ms"),
        (0.9994, "999ms"),
        (0.9996, "1s"),
        (1.0, "1s"),
        (1.4, "1s"),
        (59.0, "59s"),
        (59.6, "1m0s"),
        (60.0, "1m0s"),
        (61.0, "1m1s"),
        (360.0, "6m0s"),
        (3600.0, "60m0s"),
    ],
)
def test_rate_header_reset_format(reset: float, text: str) -> None:
    headers = rate_headers((rs("requests", 10, 3, reset),))
    assert headers["x-ratelimit-reset-requests"] == text


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ((), {}),
        (
            (rs("requests", 100, 50, 30.0), rs("requests", 10, 2, 48.0)),
            {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "2",
             "x-ratelimit-reset-requests": "48s"},
        ),
        (  # equal remaining: the one that takes longest to refill
            (rs("requests", 10, 2, 12.0), rs("requests", 60, 2, 58.0), rs("requests", 5, 2, 1)),
            {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "2",
             "x-ratelimit-reset-requests": "58s"},
        ),
        (
            (rs("tokens", 10_000, 9_000, 6.0), rs("requests", 10, 9, 6.0),
             rs("tokens", 1_000, 100, 54.0)),
            {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "9",
             "x-ratelimit-reset-requests": "6s", "x-ratelimit-limit-tokens": "1000",
             "x-ratelimit-remaining-tokens": "100", "x-ratelimit-reset-tokens": "54s"},
        ),
        (
            (rs("tokens", 1_000, 0, 0.25),),
            {"x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "0",
             "x-ratelimit-reset-tokens": "250ms"},
        ),
    ],
)  # fmt: skip
def test_rate_headers_pick_the_tightest_bucket(
    rates: tuple[RateState, ...], expected: dict[str, str]
) -> None:
    assert rate_headers(rates) == expected


# ---- store failures -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["raise", "hang"])
async def test_fail_closed(wrapped: SwitchableStore, mode: str) -> None:
    h = harness(wrapped, on_store_failure="fail_closed", store_timeout_s=0.05)
    wrapped.mode = mode
    with pytest.raises(StoreUnavailable):
        await h.admit(plan(rpm=10))
    assert h.gate.store_failures == 1
    assert h.failures == ["admit"]


@pytest.mark.parametrize("mode", ["raise", "hang"])
async def test_fail_open_admits_locally_and_bills_the_store_when_back(
    store: SqliteStore, wrapped: SwitchableStore, mode: str
) -> None:
    h = harness(wrapped, on_store_failure="fail_open", store_timeout_s=0.05)
    p = plan(rpm=1, daily_tokens=10_000)
    wrapped.mode = mode
    a = await h.admit(p, prompt=100, requested=500)
    assert a.local is True and a.max_tokens == 500
    with pytest.raises(Refused) as info:  # the local store enforces the limits too
        await h.admit(p, prompt=100, requested=500)
    assert info.value.reason == "requests"
    assert h.gate.store_failures == 2
    assert h.failures == ["admit", "admit"]
    wrapped.mode = "up"
    h.gate.settle(a, outcome(100, 42))
    await h.gate.drain()
    records = await ledger(store)
    assert [(r.request_id, r.completion_tokens) for r in records] == [(a.request.request_id, 42)]
    assert await store.budget_used(p.budgets[0].key) == (142.0, 0.0)
    assert h.settled == records


async def test_fail_open_uses_the_store_again_once_it_answers(
    store: SqliteStore, wrapped: SwitchableStore
) -> None:
    h = harness(wrapped, on_store_failure="fail_open")
    p = plan(daily_tokens=10_000)
    wrapped.mode = "raise"
    assert (await h.admit(p)).local is True
    wrapped.mode = "up"
    b = await h.admit(p, prompt=100, requested=500)
    assert b.local is False
    assert await store.budget_used(p.budgets[0].key) == (0.0, 600.0)


async def test_settle_with_the_store_down_is_logged_not_raised(
    store: SqliteStore, wrapped: SwitchableStore
) -> None:
    h = harness(wrapped)
    a = await h.admit(plan(rpm=10))
    wrapped.mode = "raise"
    h.gate.settle(a, outcome(10, 1))
    await h.gate.drain()
    assert h.gate.store_failures == 1
    assert len(h.settled) == 1  # metrics still see it
    assert await ledger(store) == []


# ---- reservation heartbeat ------------------------------------------------------------


@pytest.mark.parametrize("through_gate", [True, False])
async def test_heartbeat_keeps_live_reservations(store: SqliteStore, through_gate: bool) -> None:
    """A live admission keeps its slot past the TTL; one nobody refreshes loses it."""
    ttl = 0.3
    h = harness(store, reservation_ttl_s=ttl)
    p = plan(max_concurrent=1)
    if through_gate:
        first: Admission | None = await h.admit(p)
    else:
        first = None
        req = AdmitRequest("crashed-replica", concurrency=p.concurrency, ttl_s=ttl)
        assert (await store.admit(req)).admitted
    await asyncio.sleep(2 * ttl)
    if first is None:
        second = await h.admit(p)  # the unrefreshed slot has expired
        h.gate.settle(second, outcome(1, 1))
        await h.gate.drain()
        return
    with pytest.raises(Refused) as info:
        await h.admit(p)
    assert info.value.reason == "concurrency"
    h.gate.settle(first, outcome(100, 1))
    await h.gate.drain()
    second = await h.admit(p)  # settled: the slot is free at once
    h.gate.settle(second, outcome(1, 1))
    await h.gate.drain()


async def test_heartbeat_keeps_budget_holds(store: SqliteStore) -> None:
    ttl = 0.3
    h = harness(store, reservation_ttl_s=ttl)
    p = plan(daily_tokens=1000)
    a = await h.admit(p, prompt=100, requested=500)
    await asyncio.sleep(2 * ttl)
    assert await store.budget_used(p.budgets[0].key) == (0.0, 600.0)
    h.gate.settle(a, outcome(100, 10))
    await h.gate.drain()
    assert await store.budget_used(p.budgets[0].key) == (110.0, 0.0)
