"""The gate (app/gateway/admission.py) over a real SqliteStore: admission, refusal and its
headers, exactly-once settlement and billing, store-failure policy, the settlement journal
across a store outage (also once against a real Redis that goes away), the heartbeat."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from app.config import GatewayArgs
from app.gateway.admission import Admission, Gate, Refused, rate_headers
from app.gateway.journal import Backoff, decode
from app.gateway.plan import Plan, build_plan
from app.request import Caller, Outcome
from app.state.protocol import (
    AdmitRequest,
    LedgerQuery,
    Price,
    RateState,
    StateStore,
    StoreUnavailable,
)
from app.state.records import LedgerRecord, Limits
from app.state.redis_store import RedisStore
from app.state.sqlite_store import SqliteStore
from benchmarks.local_redis import RedisProcess
from tests.request_helpers import gated

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
    """Wraps a SqliteStore; ``mode`` "raise" fails every call, "hang" never answers,
    "land_then_raise" applies a settle and then raises (the answer was lost), once.
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
            if self.mode == "land_then_raise" and name == "settle":
                self.mode = "up"
                await target(*args, **kwargs)
                raise StoreUnavailable("the answer was lost")
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


FAST = Backoff(initial_s=0.05, max_s=0.2)


class Harness:
    def __init__(self, store: StateStore, args: GatewayArgs, **gate: Any) -> None:
        self.settled: list[LedgerRecord] = []
        self.failures: list[str] = []
        self.pending: list[int] = []
        self.journaled = 0
        gate.setdefault("replica", "ingress-0")
        gate.setdefault("retry", FAST)
        self.gate = Gate(
            store,
            args,
            on_settled=self.settled.append,
            on_failure=self.failures.append,
            on_pending=self.pending.append,
            on_journaled=self._journaled,
            **gate,
        )

    def _journaled(self) -> None:
        self.journaled += 1

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
            gated(CALLER, max_tokens=requested, session_id="sess-1"), p, prompt_tokens=prompt,
            context_left=context_left, price=price or Price(),
        )  # fmt: skip


def harness(store: Any, gate: dict[str, Any] | None = None, **args: Any) -> Harness:
    return Harness(cast(StateStore, store), GatewayArgs(**args), **(gate or {}))


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


async def test_settle_with_the_store_down_is_journaled_not_raised(
    store: SqliteStore, wrapped: SwitchableStore
) -> None:
    h = harness(wrapped)
    a = await h.admit(plan(rpm=10))
    wrapped.mode = "raise"
    h.gate.settle(a, outcome(10, 1))
    await h.gate.drain(deadline_s=0.1)
    assert h.gate.store_failures == 1
    assert h.failures == ["settle"]
    assert len(h.settled) == 1  # metrics still see it
    assert await ledger(store) == []
    assert h.gate.pending == 1 and h.journaled == 1
    assert not h.gate.journal.durable  # no journal_dir: kept in memory


# ---- store outage: the settlement journal ---------------------------------------------


def journal_file(tmp_path: Path, replica: str = "ingress-0") -> list[str]:
    """The request ids in a replica's journal file, in order."""
    path = tmp_path / "journal" / f"settle-{replica}.jsonl"
    return [decode(line).admit.request_id for line in path.read_bytes().splitlines()]


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until ``check()`` is true (the background retry did it), or fail."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_store_down_at_settle_journals_and_the_retry_bills_once(
    store: SqliteStore, wrapped: SwitchableStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.gateway.admission")
    h = harness(wrapped, {"journal_dir": tmp_path / "journal"})
    p = plan(daily_tokens=10_000, max_concurrent=1)
    a = await h.admit(p, prompt=100, requested=500)
    wrapped.mode = "raise"
    h.gate.settle(a, outcome(100, 42))
    await asyncio.gather(*h.gate._settling)
    rid = a.request.request_id
    assert journal_file(tmp_path) == [rid]  # on disk once settle has journaled it
    assert h.gate.pending == 1 and h.journaled == 1 and h.pending == [1]
    warning = next(r for r in caplog.records if "journaled" in r.getMessage())
    assert warning.levelno == logging.WARNING
    assert rid in warning.getMessage() and "acme" in warning.getMessage()
    assert "tokens 142" in warning.getMessage()
    await asyncio.sleep(0.3)  # the retry runs, and fails, meanwhile
    assert wrapped.calls.count("settle") > 2
    assert await ledger(store) == [] and h.gate.pending == 1
    wrapped.mode = "up"
    # no drain: the retry. It reports 0 pending once it has compacted the journal file,
    # after the in-memory count drops (wait for the report, not only the count)
    await until(lambda: h.gate.pending == 0 and h.pending[-1] == 0)
    records = await ledger(store)
    assert [(r.request_id, r.prompt_tokens, r.completion_tokens) for r in records] == [
        (rid, 100, 42)
    ]
    assert await store.budget_used(p.budgets[0].key) == (142.0, 0.0)  # reservation released
    b = await h.admit(p)  # and the concurrency slot with it
    assert b.local is False
    assert journal_file(tmp_path) == []  # compacted
    assert any(
        r.levelno == logging.INFO and "journal drained" in r.getMessage() for r in caplog.records
    )
    await h.gate.drain()
    assert len(await ledger(store)) == 1


async def test_a_settle_that_landed_before_its_error_is_billed_once(
    store: SqliteStore, wrapped: SwitchableStore, tmp_path: Path
) -> None:
    h = harness(wrapped, {"journal_dir": tmp_path / "journal"})
    p = plan(daily_tokens=10_000, tpm=10_000)
    a = await h.admit(p, prompt=100, requested=500)
    wrapped.mode = "land_then_raise"
    h.gate.settle(a, outcome(100, 42))
    await h.gate.drain(deadline_s=2.0)
    assert wrapped.calls.count("settle") == 2  # it was re-sent
    assert h.gate.pending == 0 and h.journaled == 1
    assert [r.completion_tokens for r in await ledger(store)] == [42]
    assert await store.budget_used(p.budgets[0].key) == (142.0, 0.0)
    assert journal_file(tmp_path) == []


async def test_drain_with_the_store_down_leaves_the_journal_for_the_next_gate(
    store: SqliteStore, wrapped: SwitchableStore, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    h = harness(wrapped, {"journal_dir": journal})
    p = plan(daily_tokens=10_000)
    admissions = [await h.admit(p, prompt=100, requested=500) for _ in range(3)]
    wrapped.mode = "raise"
    for i, a in enumerate(admissions):
        h.gate.settle(a, outcome(100, 10 * (i + 1)))
    started = time.monotonic()
    await h.gate.drain(deadline_s=0.3)
    assert 0.3 <= time.monotonic() - started < 2.0  # it tried until the deadline, no longer
    assert wrapped.calls.count("settle") > 3  # the drain re-sent
    await h.gate.close()
    ids = [a.request.request_id for a in admissions]
    assert journal_file(tmp_path) == ids
    assert await ledger(store) == []

    wrapped.mode = "up"  # the next process of this replica (or a sibling) replays it
    h2 = harness(wrapped, {"journal_dir": journal, "replica": "ingress-1"})
    assert h2.gate.pending == 3 and h2.pending == [3]
    await until(lambda: h2.gate.pending == 0)
    records = await ledger(store)
    assert sorted((r.request_id, r.completion_tokens, r.ingress) for r in records) == sorted(
        (rid, 10 * (i + 1), "ingress-0") for i, rid in enumerate(ids)
    )
    assert await store.budget_used(p.budgets[0].key) == (100.0 * 3 + 60, 0.0)
    assert not (journal / "settle-ingress-0.jsonl").exists()  # adopted, then deleted
    await h2.gate.close()
    assert list(journal.iterdir()) == []  # an empty journal leaves no file


def test_a_gate_built_outside_the_loop_replays_at_its_first_admission(tmp_path: Path) -> None:
    """Where the gate is built before any loop runs, the first call starts the retry."""

    async def leave_one() -> str:
        s = SqliteStore(tmp_path / "s.db")
        w = SwitchableStore(s)
        h = harness(w, {"journal_dir": tmp_path / "journal"})
        a = await h.admit(Plan())
        w.mode = "raise"
        h.gate.settle(a, outcome(5, 5))
        await h.gate.drain(deadline_s=0)
        await h.gate.close()  # the process ends: the file stays, unlocked
        await s.close()
        return a.request.request_id

    rid = asyncio.run(leave_one())
    s = SqliteStore(tmp_path / "s.db")
    h = harness(s, {"journal_dir": tmp_path / "journal"})  # no running loop here
    assert h.gate.pending == 1

    async def serve() -> list[LedgerRecord]:
        await h.admit(Plan())
        await until(lambda: h.gate.pending == 0)
        records = await ledger(s)
        await s.close()
        return records

    assert [r.request_id for r in asyncio.run(serve())] == [rid]


async def test_fail_open_journals_the_shared_settle(
    store: SqliteStore, wrapped: SwitchableStore, tmp_path: Path
) -> None:
    h = harness(wrapped, {"journal_dir": tmp_path / "journal"}, on_store_failure="fail_open")
    p = plan(daily_tokens=10_000)
    wrapped.mode = "raise"
    a = await h.admit(p, prompt=100, requested=500)
    assert a.local is True
    h.gate.settle(a, outcome(100, 42))  # the local store settles; the shared one is down
    await h.gate.drain(deadline_s=0.1)
    assert journal_file(tmp_path) == [a.request.request_id]
    assert h.failures == ["admit", "settle"]
    wrapped.mode = "up"
    await h.gate.drain(deadline_s=2.0)
    assert [(r.request_id, r.completion_tokens) for r in await ledger(store)] == [
        (a.request.request_id, 42)
    ]
    assert await store.budget_used(p.budgets[0].key) == (142.0, 0.0)
    assert journal_file(tmp_path) == []


async def test_the_retry_backs_off_while_the_store_is_down(
    store: SqliteStore, wrapped: SwitchableStore
) -> None:
    h = harness(wrapped, {"retry": Backoff(initial_s=0.02, max_s=0.2)})
    a = await h.admit(plan(rpm=10))
    wrapped.mode = "raise"
    h.gate.settle(a, outcome(1, 1))
    await asyncio.sleep(1.0)
    tries = wrapped.calls.count("settle") - 1
    # 0.02, 0.04, 0.08, 0.16, then every 0.2 s: about 8 in a second (never hundreds)
    assert 4 <= tries <= 12
    wrapped.mode = "up"
    await h.gate.drain(deadline_s=2.0)
    assert len(await ledger(store)) == 1


async def test_a_store_answer_wakes_the_retry_early(
    store: SqliteStore, wrapped: SwitchableStore
) -> None:
    h = harness(wrapped, {"retry": Backoff(initial_s=0.05, max_s=30.0, factor=100.0)})
    a = await h.admit(plan(rpm=10))
    wrapped.mode = "raise"
    h.gate.settle(a, outcome(1, 1))
    await asyncio.sleep(0.3)  # tried after 0.05 s; the next try is 5 s away
    assert wrapped.calls.count("settle") == 2
    wrapped.mode = "up"
    await h.admit(plan(rpm=10))  # the store answers: try now
    await until(lambda: h.gate.pending == 0, timeout_s=1.0)
    assert wrapped.calls.count("settle") == 3
    assert len(await ledger(store)) == 1


async def test_an_unusable_journal_dir_keeps_settlements_in_memory(
    store: SqliteStore, wrapped: SwitchableStore, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("")
    h = harness(wrapped, {"journal_dir": tmp_path / "file" / "journal"})
    assert not h.gate.journal.durable
    a = await h.admit(plan(rpm=10))
    wrapped.mode = "raise"
    h.gate.settle(a, outcome(1, 1))
    await h.gate.drain(deadline_s=0.1)
    assert h.gate.pending == 1
    wrapped.mode = "up"
    await h.gate.drain(deadline_s=2.0)
    assert len(await ledger(store)) == 1


# ---- a real Redis that goes away ------------------------------------------------------


async def test_a_redis_outage_loses_no_ledger_record(
    redis_process: RedisProcess, tmp_path: Path
) -> None:
    store = RedisStore(redis_process.url, namespace="outage", timeout_s=0.2)
    h = harness(store, {"journal_dir": tmp_path / "journal"}, store_timeout_s=0.3)
    p = plan(daily_tokens=100_000, max_concurrent=4)
    admissions = [await h.admit(p, prompt=100, requested=500) for _ in range(4)]
    assert await store.budget_used(p.budgets[0].key) == (0.0, 2400.0)
    redis_process.stop()  # the outage
    for i, a in enumerate(admissions):
        h.gate.settle(a, outcome(100, 10 * (i + 1)))
    await h.gate.drain(deadline_s=0)
    ids = [a.request.request_id for a in admissions]
    assert sorted(journal_file(tmp_path)) == sorted(ids)
    assert h.failures == ["settle"] * 4
    redis_process.start()  # back, with its data: the reservations are still held
    await until(lambda: h.gate.pending == 0, timeout_s=10.0)
    records = await store.query_ledger(LedgerQuery(tenant="acme"))
    assert sorted((r.request_id, r.prompt_tokens, r.completion_tokens) for r in records) == sorted(
        (rid, 100, 10 * (i + 1)) for i, rid in enumerate(ids)
    )
    assert await store.budget_used(p.budgets[0].key) == (400.0 + 100, 0.0)
    more = [await h.admit(p, prompt=1, requested=1) for _ in range(4)]  # slots released
    assert all(not a.local for a in more)
    assert journal_file(tmp_path) == []
    for a in more:
        h.gate.settle(a, outcome(1, 1))
    await h.gate.drain()
    await h.gate.close()
    await store.close()


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


# ---- a replica that vanished ----------------------------------------------------------


async def test_a_replica_that_vanished_is_recorded_lost_by_the_next(store: SqliteStore) -> None:
    """Replica A admits a request and is killed (no settle, no drain, no heartbeat): the
    heartbeat of replica B, which serves nothing at that moment, records the request
    lost once its reservation expired, bills its prompt, and B gets the slot."""
    ttl = 0.3
    p = plan(max_concurrent=1, daily_tokens=10_000)
    a = harness(store, {"replica": "ingress-a"}, reservation_ttl_s=ttl)
    held = await a.gate.admit(
        gated(CALLER, max_tokens=50, session_id="sess-1", request_id="req-gone",
              client_request_id="client-7", endpoint="completion"),
        p, prompt_tokens=100, context_left=4000, price=Price(input=2 * M, output=8 * M),
    )  # fmt: skip
    assert held.request.pending is not None
    heartbeat = a.gate._heartbeat
    assert heartbeat is not None
    heartbeat.cancel()  # SIGKILL: nothing of replica A runs any more
    del a

    b = harness(store, {"replica": "ingress-b"}, reservation_ttl_s=ttl)
    other = await b.admit(plan(rpm=100))  # starts B's heartbeat
    b.gate.settle(other, outcome(1, 1))
    await b.gate.drain()
    assert b.gate.live == 0
    with pytest.raises(Refused) as info:  # A's request still holds the slot
        await b.admit(p)
    assert info.value.reason == "concurrency"

    deadline = time.monotonic() + 5.0
    while not (lost := [r for r in await ledger(store) if r.status == "lost"]):
        assert time.monotonic() < deadline, "B never swept A's request"
        await asyncio.sleep(0.05)
    (rec,) = lost
    assert rec.model_dump(
        exclude={"started_at", "ended_at", "e2e_s", "cost_usd"}
    ) == {
        "request_id": "req-gone", "client_request_id": "client-7", "session_id": "sess-1",
        "session_slo_ms": None,
        "tenant": "acme", "team": "ml", "user": "alice", "key_id": "abc123abc123",
        "model_requested": "m", "model_served": None, "adapter": None, "pool": None,
        "route_step": None,
        "attempts": 0, "endpoint": "completion", "status": "lost", "http_status": 0,
        "prompt_tokens": 100, "completion_tokens": 0, "cached_tokens": 0, "ttft_s": None,
        "gpu_seconds": None, "gpu_cost_usd": None,  # no engine reported: none known
        "ingress": "ingress-a",
    }  # fmt: skip
    assert rec.cost_usd == pytest.approx(100 * 2 * M)
    assert rec.started_at == held.started_wall
    assert rec.ended_at >= rec.started_at + ttl
    assert rec.e2e_s == pytest.approx(rec.ended_at - rec.started_at)
    assert await store.budget_used(p.budgets[0].key) == (100.0, 0.0)

    again = await b.admit(p)  # the freed slot
    b.gate.settle(again, outcome(10, 5))
    await b.gate.drain()
    records = await ledger(store)
    assert sorted((r.request_id == "req-gone", r.status) for r in records) == [
        (False, "ok"), (False, "ok"), (True, "lost"),
    ]  # fmt: skip
    assert await store.budget_used(p.budgets[0].key) == (115.0, 0.0)
    assert b.failures == [] and b.gate.store_failures == 0


async def test_the_heartbeat_sweeps_without_live_requests_and_only_logs_failures(
    wrapped: SwitchableStore, caplog: pytest.LogCaptureFixture
) -> None:
    ttl = 0.3
    h = harness(wrapped, reservation_ttl_s=ttl)
    a = await h.admit(Plan())
    h.gate.settle(a, outcome(1, 1))
    await h.gate.drain()
    assert h.gate.live == 0
    wrapped.mode = "raise"
    await asyncio.sleep(0.5)
    sweeps = wrapped.calls.count("sweep_lost")
    assert 2 <= sweeps <= 6  # one when the heartbeat started, then one per ttl/3
    failed = [r for r in caplog.records if "sweep for lost requests failed" in r.message]
    assert failed and {r.levelno for r in failed} == {logging.WARNING}
    assert h.gate.store_failures == 0 and h.failures == []


@pytest.mark.parametrize(
    ("reserved", "counted", "billed"), [(0, 37, 37), (100, None, 100), (0, None, 0)]
)
async def test_the_lost_record_bills_the_counted_prompt(
    store: SqliteStore, reserved: int, counted: int | None, billed: int
) -> None:
    """A tenant without token budgets reserves no prompt tokens, but the gateway counted
    the prompt: a lost request is still billed the prompt it had."""
    h = harness(store)
    admission = await h.gate.admit(
        gated(CALLER, max_tokens=5), plan(max_concurrent=5), prompt_tokens=reserved,
        context_left=100, price=Price(input=M), counted_prompt_tokens=counted,
    )  # fmt: skip
    pending = admission.request.pending
    assert pending is not None
    assert (pending.prompt_tokens, pending.cost_usd) == (billed, pytest.approx(billed * M))
    assert admission.request.prompt_tokens == reserved
    await h.gate.close()


@pytest.mark.parametrize(
    ("n", "requested", "reserved_output", "per_choice", "capped"),
    [
        (3, 100, 300, 100, False),  # every choice's output is reserved
        (3, 400, 900, 300, True),  # the budget (900 left) is shared by the choices
        (2, None, 900, 450, True),
    ],
)
async def test_n_choices_reserve_and_share_the_budget(
    store: SqliteStore,
    n: int,
    requested: int | None,
    reserved_output: int,
    per_choice: int,
    capped: bool,
) -> None:
    h = harness(store)
    request = replace(gated(CALLER, max_tokens=requested), n=n)
    a = await h.gate.admit(
        request, plan(daily_tokens=1000), prompt_tokens=100, context_left=4000, price=Price()
    )
    assert a.result.reserved_tokens == 100 + reserved_output
    assert (a.max_tokens, a.capped) == (per_choice, capped)
