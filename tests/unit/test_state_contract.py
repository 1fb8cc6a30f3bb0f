"""The contract every StateStore meets (app/state/protocol.py), run against each backend:
Redis (a real redis-server, one namespace per test) and SQLite (one file per test)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from app.state.protocol import (
    AdmitRequest,
    AdmitResult,
    BudgetCheck,
    ConcurrencyCheck,
    LedgerQuery,
    Price,
    RateCheck,
    SettleRequest,
    StateStore,
    StoreUnavailable,
)
from app.state.records import (
    AdapterRecord,
    KeyRecord,
    LedgerRecord,
    Limits,
    LimitsRecord,
    TenantRecord,
)
from app.state.redis_store import RedisStore

_ids = itertools.count()


def rid() -> str:
    return f"req-{next(_ids)}"


def far() -> float:
    return time.time() + 3600


def budget(key: str = "budget:tenant:acme:tokens:d", limit: float = 1000) -> BudgetCheck:
    unit = "usd" if ":usd" in key else "tokens"
    return BudgetCheck(key, unit, limit, far())


def record(request_id: str, *, tenant: str = "acme", ended_at: float | None = None) -> LedgerRecord:
    end = time.time() if ended_at is None else ended_at
    return LedgerRecord(
        request_id=request_id,
        tenant=tenant,
        model_requested="m",
        endpoint="/v1/chat/completions",
        status="ok",
        http_status=200,
        prompt_tokens=10,
        completion_tokens=5,
        e2e_s=0.5,
        started_at=end - 0.5,
        ended_at=end,
    )


async def settle(
    store: StateStore,
    req: AdmitRequest,
    res: AdmitResult,
    used_tokens: int,
    used_usd: float = 0.0,
    **kw: object,
) -> bool:
    rec = kw.pop("record", None) or record(req.request_id)
    assert isinstance(rec, LedgerRecord)
    key_id = kw.pop("key_id", None)
    assert key_id is None or isinstance(key_id, str)
    return await store.settle(SettleRequest(req, res, used_tokens, used_usd, rec, key_id))


@pytest.fixture(params=["redis", "sqlite"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, redis_namespace: str
) -> AsyncIterator[StateStore]:
    if request.param == "redis":
        # The contract is what the state holds after each call, not how fast a call is:
        # a deadline that a loaded CI box can miss opening fifty connections at once (the
        # concurrency tests) would fail them for the wrong reason. Deadlines are tested
        # where they are the point (test_gateway_admission's store outage).
        s: StateStore = RedisStore(
            request.getfixturevalue("redis_server_url"), namespace=redis_namespace,
            timeout_s=5.0,
        )
    else:
        from app.state.sqlite_store import SqliteStore

        s = SqliteStore(tmp_path / "state.db")
    await s.ping()
    yield s
    await s.close()


# ---- identity records ----------------------------------------------------------------


def key(kid: str, tenant: str = "acme", **kw: object) -> KeyRecord:
    return KeyRecord.model_validate(
        {"id": kid, "prefix": "sy-" + kid, "salt": "00", "digest": "ff", "tenant": tenant,
         "created_at": 1.0, **kw}
    )  # fmt: skip


async def test_records_round_trip(store: StateStore) -> None:
    k1 = key("k1", limits=Limits(rpm=10), team="red", user="ann", name="ci")
    k2 = key("k2", tenant="globex")
    k3 = key("k3")
    for k in (k3, k1, k2):
        await store.put_key(k)
    assert await store.get_key("k1") == k1
    assert await store.get_key("nope") is None
    assert sorted(k.id for k in await store.list_keys()) == ["k1", "k2", "k3"]
    assert sorted(k.id for k in await store.list_keys("acme")) == ["k1", "k3"]
    assert await store.list_keys("nobody") == []
    revoked = k1.model_copy(update={"revoked_at": 5.0})
    await store.put_key(revoked)
    assert await store.get_key("k1") == revoked
    assert len(await store.list_keys()) == 3

    t1 = TenantRecord(id="acme", limits=Limits(daily_tokens=100), created_at=2.0)
    t2 = TenantRecord(id="globex", disabled=True)
    await store.put_tenant(t1)
    await store.put_tenant(t2)
    assert await store.get_tenant("acme") == t1
    assert await store.get_tenant("nope") is None
    assert sorted(t.id for t in await store.list_tenants()) == ["acme", "globex"]

    team = LimitsRecord(level="team", tenant="acme", name="red", limits=Limits(tpm=500))
    user = LimitsRecord(level="user", tenant="acme", name="red", limits=Limits(rpm=5))
    await store.put_limits(team)
    await store.put_limits(user)
    await store.put_limits(team.model_copy(update={"limits": Limits(tpm=600)}))
    got = {r.scope: r for r in await store.list_limits()}
    assert set(got) == {"team:acme/red", "user:acme/red"}
    assert got["team:acme/red"].limits.tpm == 600
    assert got["user:acme/red"] == user


async def test_adapters_round_trip_and_delete(store: StateStore) -> None:
    public = AdapterRecord(id="m:a", base="m", name="a", source="/adapters/a", rank=8)
    private = AdapterRecord(
        id="m:b", base="m", name="b", source="s3://bucket/b", rank=16, tenant="acme",
        price_per_1m_in=0.5, created_at=3.0,
    )  # fmt: skip
    for a in (private, public):
        await store.put_adapter(a)
    assert await store.get_adapter("m:b") == private
    assert await store.get_adapter("m:zz") is None
    assert [a.id for a in await store.list_adapters()] == ["m:a", "m:b"]
    assert (private.visible_to("acme"), private.visible_to("globex")) == (True, False)
    assert public.visible_to("globex")
    assert await store.delete_adapter("m:a") is True
    assert await store.delete_adapter("m:a") is False
    assert [a.id for a in await store.list_adapters()] == ["m:b"]
    assert await store.get_adapter("m:a") is None


async def _principal_fixture(store: StateStore) -> None:
    await store.put_tenant(TenantRecord(id="acme", limits=Limits(rpm=100)))
    await store.put_tenant(TenantRecord(id="globex"))
    for tenant, level, name in [
        ("acme", "team", "red"),
        ("acme", "user", "ann"),
        ("globex", "team", "red"),
        ("globex", "user", "ann"),
        ("acme", "team", "blue"),
    ]:
        limits = Limits(rpm=len(tenant) + len(name))
        await store.put_limits(LimitsRecord(level=level, tenant=tenant, name=name, limits=limits))  # type: ignore[arg-type]
    await store.put_key(key("k1", team="red", user="ann"))
    await store.put_key(key("k2"))


async def test_load_principal_from_key_wins_over_arguments(store: StateStore) -> None:
    await _principal_fixture(store)
    p = await store.load_principal(key_id="k1", tenant="globex", team="blue", user="bob")
    assert p.key is not None and p.key.id == "k1"
    assert p.tenant is not None and p.tenant.id == "acme"
    assert p.team is not None and p.team.scope == "team:acme/red"
    assert p.user is not None and p.user.scope == "user:acme/ann"
    # a key without team/user: none, whatever the arguments say
    p = await store.load_principal(key_id="k2", team="red", user="ann")
    assert p.key is not None and p.tenant is not None and p.tenant.id == "acme"
    assert p.team is None and p.user is None
    # an unknown key yields nothing
    p = await store.load_principal(key_id="nope", tenant="acme")
    assert p.key is None and p.tenant is None and p.team is None and p.user is None


@pytest.mark.parametrize(
    ("tenant", "team", "user", "want"),
    [
        ("globex", "red", "ann", ("globex", "team:globex/red", "user:globex/ann")),
        ("acme", "blue", None, ("acme", "team:acme/blue", None)),
        ("acme", None, "bob", ("acme", None, None)),
        ("initech", "red", "ann", (None, None, None)),
        (None, "red", "ann", (None, None, None)),
    ],
)
async def test_load_principal_without_key(
    store: StateStore,
    tenant: str | None,
    team: str | None,
    user: str | None,
    want: tuple[str | None, str | None, str | None],
) -> None:
    await _principal_fixture(store)
    p = await store.load_principal(tenant=tenant, team=team, user=user)
    assert p.key is None
    got = (
        p.tenant and p.tenant.id,
        p.team and p.team.scope,
        p.user and p.user.scope,
    )
    assert got == want


# ---- rate buckets --------------------------------------------------------------------


async def test_rpm_bucket_refuses_and_refills(store: StateStore) -> None:
    rpm = RateCheck("rate:key:k1:requests", "requests", 120)  # refills 2 per second
    for n in range(120):
        res = await store.admit(AdmitRequest(rid(), rates=(rpm,)))
        assert res.admitted, n
    assert res.rates[0].limit == 120 and res.rates[0].remaining == 0
    assert 0 < res.rates[0].reset_s <= 60
    refused = await store.admit(AdmitRequest(rid(), rates=(rpm,)))
    assert not refused.admitted
    assert refused.reason == "requests" and refused.scope_key == rpm.key
    assert 0 < refused.retry_after_s <= 0.5
    await asyncio.sleep(0.6)
    assert (await store.admit(AdmitRequest(rid(), rates=(rpm,)))).admitted


async def test_tpm_bucket_costs_prompt_plus_allowance_and_settle_refunds(store: StateStore) -> None:
    tpm = RateCheck("rate:key:k1:tokens", "tokens", 1000)
    req = AdmitRequest(rid(), rates=(tpm,), prompt_tokens=100, max_output_tokens=200)
    res = await store.admit(req)
    assert res.admitted and res.allowance == 200 and res.reserved_tokens == 300
    assert res.rates[0].kind == "tokens" and res.rates[0].remaining == 700
    # more than is left: refused, retry when the deficit has refilled (1000/60 per second)
    big = AdmitRequest(rid(), rates=(tpm,), prompt_tokens=500, max_output_tokens=400)
    refused = await store.admit(big)
    assert not refused.admitted and refused.reason == "tokens" and refused.scope_key == tpm.key
    assert 10 < refused.retry_after_s <= 200 * 60 / 1000
    # more than the capacity: can never pass
    huge = AdmitRequest(rid(), rates=(tpm,), prompt_tokens=900, max_output_tokens=200)
    assert (await store.admit(huge)).retry_after_s == 60
    # settle refunds the unused 150 tokens
    assert await settle(store, req, res, used_tokens=150)
    probe = await store.admit(AdmitRequest(rid(), rates=(tpm,), max_output_tokens=0))
    assert probe.admitted and 850 <= probe.rates[0].remaining < 900


async def test_refund_is_capped_at_capacity(store: StateStore) -> None:
    tpm = RateCheck("rate:key:k1:tokens", "tokens", 100)
    req = AdmitRequest(rid(), rates=(tpm,), prompt_tokens=10, max_output_tokens=20)
    res = await store.admit(req)
    assert res.rates[0].remaining == 70
    # a result claiming a larger reservation cannot overfill the bucket
    inflated = AdmitResult(True, allowance=20, reserved_tokens=500)
    assert await settle(store, req, inflated, used_tokens=0)
    probe = await store.admit(AdmitRequest(rid(), rates=(tpm,)))
    assert probe.rates[0].remaining == 100


# ---- concurrency ---------------------------------------------------------------------


async def test_concurrency_limit_and_release_on_settle(store: StateStore) -> None:
    conc = ConcurrencyCheck("conc:key:k1", 2)
    a, b, c = (AdmitRequest(rid(), concurrency=(conc,)) for _ in range(3))
    ra = await store.admit(a)
    assert ra.admitted and (await store.admit(b)).admitted
    refused = await store.admit(c)
    assert not refused.admitted and refused.reason == "concurrency"
    assert refused.scope_key == conc.key and refused.retry_after_s == 1
    assert await settle(store, a, ra, used_tokens=0)
    assert (await store.admit(c)).admitted


async def test_concurrency_slot_expires_and_refresh_extends_it(store: StateStore) -> None:
    conc = ConcurrencyCheck("conc:key:k1", 1)
    a = AdmitRequest(rid(), concurrency=(conc,), ttl_s=0.3)
    assert (await store.admit(a)).admitted
    assert not (await store.admit(AdmitRequest(rid(), concurrency=(conc,)))).admitted
    await asyncio.sleep(0.45)  # a crashed replica's slot frees itself
    b = AdmitRequest(rid(), concurrency=(conc,), ttl_s=0.3)
    assert (await store.admit(b)).admitted
    await asyncio.sleep(0.1)
    await store.refresh([b], 1.0)
    await asyncio.sleep(0.35)  # past b's first expiry, before the refreshed one
    assert not (await store.admit(AdmitRequest(rid(), concurrency=(conc,)))).admitted
    await asyncio.sleep(0.8)
    assert (await store.admit(AdmitRequest(rid(), concurrency=(conc,)))).admitted


async def test_refresh_ignores_settled_and_unknown_requests(store: StateStore) -> None:
    conc = ConcurrencyCheck("conc:key:k1", 1)
    bud = budget()
    a = AdmitRequest(rid(), concurrency=(conc,), budgets=(bud,), prompt_tokens=10)
    ra = await store.admit(a)
    assert await settle(store, a, ra, used_tokens=10)
    await store.refresh([a, AdmitRequest(rid(), concurrency=(conc,), budgets=(bud,))], 60)
    await store.refresh([], 60)
    assert await store.budget_used(bud.key) == (10, 0)
    assert (await store.admit(AdmitRequest(rid(), concurrency=(conc,)))).admitted


# ---- budgets -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "requested", "minimum", "admitted", "allowance"),
    [
        (50, 100, 1, True, 100),  # fits: what was asked
        (50, 1000, 1, True, 350),  # capped: 1000 - 300 used - 300 held - 50 prompt
        (50, 1000, 350, True, 350),  # exactly the minimum
        (50, 1000, 351, False, 0),  # below the minimum: refused
        (340, 1000, 20, True, 60),
        (395, 1000, 20, False, 0),
        (395, 3, 20, True, 3),  # the minimum is min(min_output, requested)
        (400, 0, 1, True, 0),  # nothing left for output, nothing asked
        (401, 0, 1, False, 0),  # not even the prompt fits
    ],
)
async def test_budget_allowance(
    store: StateStore, prompt: int, requested: int, minimum: int, admitted: bool, allowance: int
) -> None:
    bud = budget(limit=1000)
    first = AdmitRequest(rid(), budgets=(bud,), prompt_tokens=100, max_output_tokens=200)
    assert await settle(store, first, await store.admit(first), used_tokens=300)
    held = AdmitRequest(rid(), budgets=(bud,), prompt_tokens=100, max_output_tokens=200)
    assert (await store.admit(held)).reserved_tokens == 300
    assert await store.budget_used(bud.key) == (300, 300)

    req = AdmitRequest(
        rid(),
        budgets=(bud,),
        prompt_tokens=prompt,
        max_output_tokens=requested,
        min_output_tokens=minimum,
    )
    res = await store.admit(req)
    assert res.admitted is admitted
    if admitted:
        assert res.allowance == allowance and res.reserved_tokens == prompt + allowance
        assert await store.budget_used(bud.key) == (300, 300 + prompt + allowance)
    else:
        assert res.reason == "budget" and res.scope_key == bud.key and res.retry_after_s == 0
        assert await store.budget_used(bud.key) == (300, 300)


async def test_tightest_budget_wins(store: StateStore) -> None:
    day, month = budget("budget:t:acme:tokens:d", 500), budget("budget:t:acme:tokens:m", 80)
    req = AdmitRequest(rid(), budgets=(day, month), prompt_tokens=30, max_output_tokens=100)
    res = await store.admit(req)
    assert res.admitted and res.allowance == 50
    assert await store.budget_used(day.key) == (0, 80) == await store.budget_used(month.key)
    # both refuse; the scope is the tightest one, not the first
    req2 = AdmitRequest(
        rid(), budgets=(day, month), prompt_tokens=415, max_output_tokens=10, min_output_tokens=10
    )
    refused = await store.admit(req2)
    assert refused.reason == "budget" and refused.scope_key == month.key


@pytest.mark.parametrize(
    ("price", "prompt", "requested", "admitted", "allowance", "usd"),
    [
        (Price(input=1 / 16, output=1 / 8), 4, 100, True, 6, 1.0),  # (1 - 4/16) / (1/8)
        (Price(input=1 / 16, output=1 / 8), 4, 3, True, 3, 0.25 + 3 / 8),
        (Price(input=1 / 16, output=1 / 8), 16, 100, False, 0, 0.0),  # prompt alone is $1
        (Price(input=1 / 16, output=1 / 8), 15, 100, False, 0, 0.0),  # 0.5 token fits
        (Price(input=1 / 16, output=0.0), 16, 100, True, 100, 1.0),  # output is free
        (Price(input=1 / 16, output=0.0), 17, 100, False, 0, 0.0),
    ],
)
async def test_usd_budget_allowance(
    store: StateStore,
    price: Price,
    prompt: int,
    requested: int,
    admitted: bool,
    allowance: int,
    usd: float,
) -> None:
    bud = budget("budget:tenant:acme:usd:d", limit=1.0)
    req = AdmitRequest(
        rid(), budgets=(bud,), prompt_tokens=prompt, max_output_tokens=requested, price=price
    )
    res = await store.admit(req)
    assert res.admitted is admitted
    assert res.allowance == allowance
    assert res.reserved_usd == pytest.approx(usd)
    assert await store.budget_used(bud.key) == pytest.approx((0.0, usd))
    if admitted:
        assert await settle(store, req, res, used_tokens=prompt + 1, used_usd=0.3)
        assert await store.budget_used(bud.key) == pytest.approx((0.3, 0.0))


async def test_settle_replaces_reservation_once(store: StateStore) -> None:
    bud = budget()
    req = AdmitRequest(rid(), budgets=(bud,), prompt_tokens=100, max_output_tokens=200)
    res = await store.admit(req)
    assert await store.budget_used(bud.key) == (0, 300)
    assert await settle(store, req, res, used_tokens=180, key_id="k1")
    assert await store.budget_used(bud.key) == (180, 0)
    assert not await settle(store, req, res, used_tokens=180, key_id="k1")
    assert await store.budget_used(bud.key) == (180, 0)
    ledger = await store.query_ledger(LedgerQuery())
    assert [r.request_id for r in ledger] == [req.request_id]


async def test_settle_counts_usage_after_the_reservation_expired(store: StateStore) -> None:
    bud = budget()
    req = AdmitRequest(rid(), budgets=(bud,), prompt_tokens=10, max_output_tokens=10, ttl_s=0.2)
    res = await store.admit(req)
    await asyncio.sleep(0.3)
    assert await store.budget_used(bud.key) == (0, 0)
    assert await settle(store, req, res, used_tokens=15)
    assert await store.budget_used(bud.key) == (15, 0)


async def test_settle_records_key_last_use(store: StateStore) -> None:
    await store.put_key(key("k1"))
    req = AdmitRequest(rid())
    assert await settle(
        store,
        req,
        await store.admit(req),
        0,
        key_id="k1",
        record=record(req.request_id, ended_at=1234.5),
    )
    got = await store.get_key("k1")
    assert got is not None and got.last_used_at == 1234.5
    assert [k.last_used_at for k in await store.list_keys()] == [1234.5]


# ---- the ledger ----------------------------------------------------------------------


async def test_query_ledger(store: StateStore) -> None:
    tenants = ["acme", "globex", "acme", "acme", "globex", "acme"]
    written = []
    for i, tenant in enumerate(tenants):
        req = AdmitRequest(rid())
        rec = record(req.request_id, tenant=tenant, ended_at=1000.0 + i)
        assert await settle(store, req, await store.admit(req), 0, record=rec)
        written.append(rec)

    def ids(recs: list[LedgerRecord]) -> list[int]:
        return [int(r.ended_at) - 1000 for r in recs]

    everything = await store.query_ledger(LedgerQuery())
    assert everything == written
    assert ids(await store.query_ledger(LedgerQuery(tenant="acme"))) == [0, 2, 3, 5]
    assert ids(await store.query_ledger(LedgerQuery(since=1002, until=1005))) == [2, 3, 4]
    assert ids(await store.query_ledger(LedgerQuery(tenant="globex", since=1002))) == [4]
    newest = await store.query_ledger(LedgerQuery(tenant="acme", limit=2))
    assert ids(newest) == [5, 3]
    assert ids(await store.query_ledger(LedgerQuery(until=1003, limit=2))) == [2, 1]
    assert await store.query_ledger(LedgerQuery(tenant="initech")) == []


async def _ledger_of_three(store: StateStore) -> list[LedgerRecord]:
    written = []
    for i, tenant in enumerate(["acme", "globex", "acme"]):
        req = AdmitRequest(rid(), budgets=(budget(),), prompt_tokens=5)
        rec = record(req.request_id, tenant=tenant, ended_at=2000.0 + i)
        assert await settle(store, req, await store.admit(req), 5, record=rec)
        written.append(rec)
    return written


async def test_query_ledger_by_request_id(store: StateStore) -> None:
    a0, g1, a2 = await _ledger_of_three(store)
    assert await store.query_ledger(LedgerQuery(request_id=g1.request_id)) == [g1]
    assert await store.query_ledger(LedgerQuery(request_id=a2.request_id)) == [a2]
    assert await store.query_ledger(LedgerQuery(request_id=a0.request_id, limit=5)) == [a0]


async def test_query_ledger_by_unknown_request_id(store: StateStore) -> None:
    a0, _, _ = await _ledger_of_three(store)
    assert await store.query_ledger(LedgerQuery(request_id="req-nobody")) == []
    assert await store.query_ledger(LedgerQuery(request_id="req-nobody", tenant="acme")) == []
    assert await store.query_ledger(LedgerQuery(request_id=a0.request_id + "x")) == []


async def test_query_ledger_by_request_id_ands_the_other_filters(store: StateStore) -> None:
    a0, g1, _ = await _ledger_of_three(store)
    assert await store.query_ledger(LedgerQuery(request_id=g1.request_id, tenant="acme")) == []
    assert await store.query_ledger(LedgerQuery(request_id=g1.request_id, tenant="initech")) == []
    assert await store.query_ledger(LedgerQuery(request_id=g1.request_id, tenant="globex")) == [g1]
    assert await store.query_ledger(LedgerQuery(request_id=a0.request_id, since=2000.5)) == []
    assert await store.query_ledger(LedgerQuery(request_id=a0.request_id, until=2000.0)) == []
    window = LedgerQuery(request_id=a0.request_id, tenant="acme", since=2000.0, until=2000.5)
    assert await store.query_ledger(window) == [a0]


async def test_settling_twice_leaves_one_record_by_request_id(store: StateStore) -> None:
    req = AdmitRequest(rid(), budgets=(budget(),), prompt_tokens=10, max_output_tokens=10)
    res = await store.admit(req)
    rec = record(req.request_id, tenant="globex")
    assert await settle(store, req, res, 12, record=rec, key_id="k1")
    assert not await settle(store, req, res, 12, record=rec, key_id="k1")
    assert await store.query_ledger(LedgerQuery(request_id=req.request_id)) == [rec]
    assert await store.query_ledger(LedgerQuery(request_id=req.request_id, tenant="globex")) == [
        rec
    ]
    assert await store.query_ledger(LedgerQuery()) == [rec]
    assert await store.budget_used(budget().key) == (12, 0)


# ---- refusals change nothing ---------------------------------------------------------

RPM = RateCheck("rate:key:k1:requests", "requests", 10)
TPM = RateCheck("rate:key:k1:tokens", "tokens", 1000)
CONC = ConcurrencyCheck("conc:key:k1", 1)
BUDGET = BudgetCheck("budget:tenant:acme:tokens:d", "tokens", 10_000, 0.0)


@pytest.mark.parametrize(
    ("reason", "blocker"),
    [
        ("concurrency", ConcurrencyCheck("conc:team:red", 1)),
        ("requests", RateCheck("rate:team:red:requests", "requests", 1)),
        ("budget", BudgetCheck("budget:team:red:tokens:d", "tokens", 50, 0.0)),
        ("tokens", RateCheck("rate:team:red:tokens", "tokens", 50)),
    ],
)
async def test_a_refused_admit_changes_nothing(
    store: StateStore, reason: str, blocker: RateCheck | ConcurrencyCheck | BudgetCheck
) -> None:
    shared_budget = BudgetCheck(BUDGET.key, "tokens", BUDGET.limit, far())
    if isinstance(blocker, BudgetCheck):
        blocker = BudgetCheck(blocker.key, blocker.unit, blocker.limit, far())
    checks: dict[str, tuple[object, ...]] = {
        "rates": (RPM, TPM),
        "concurrency": (CONC,),
        "budgets": (shared_budget,),
    }
    if isinstance(blocker, ConcurrencyCheck):
        assert (await store.admit(AdmitRequest(rid(), concurrency=(blocker,)))).admitted
        checks["concurrency"] += (blocker,)
    elif isinstance(blocker, RateCheck):
        if blocker.kind == "requests":
            assert (await store.admit(AdmitRequest(rid(), rates=(blocker,)))).admitted
        checks["rates"] += (blocker,)
    else:
        checks["budgets"] += (blocker,)
    req = AdmitRequest(rid(), prompt_tokens=60, max_output_tokens=60, **checks)  # type: ignore[arg-type]
    res = await store.admit(req)
    assert not res.admitted and res.reason == reason
    assert [s.kind for s in res.rates] == [c.kind for c in checks["rates"]]
    assert res.rates[0].remaining == 10 and res.rates[1].remaining == 1000

    probe = AdmitRequest(
        rid(), rates=(RPM, TPM), concurrency=(CONC,), budgets=(shared_budget,),
        prompt_tokens=10, max_output_tokens=10,
    )  # fmt: skip
    got = await store.admit(probe)
    assert got.admitted
    assert [s.remaining for s in got.rates] == [9, 980]
    assert await store.budget_used(shared_budget.key) == (0, 20)
    if isinstance(blocker, BudgetCheck):
        assert await store.budget_used(blocker.key) == (0, 0)


# ---- atomicity under concurrency -----------------------------------------------------


@pytest.mark.parametrize(
    ("make", "fits"),
    [
        (lambda: AdmitRequest(rid(), budgets=(budget(limit=500),), prompt_tokens=10,
                              max_output_tokens=10, min_output_tokens=10), 25),
        (lambda: AdmitRequest(rid(), rates=(RateCheck("rate:key:k1:requests", "requests", 30),)),
         30),
        (lambda: AdmitRequest(rid(), concurrency=(ConcurrencyCheck("conc:key:k1", 7),)), 7),
    ],
    ids=["budget", "rpm", "concurrency"],
)  # fmt: skip
async def test_concurrent_admits_take_exactly_what_fits(
    store: StateStore, make: Callable[[], AdmitRequest], fits: int
) -> None:
    results = await asyncio.gather(*(store.admit(make()) for _ in range(50)))
    assert sum(r.admitted for r in results) == fits
    if fits == 25:
        assert await store.budget_used(budget().key) == (0, 500)


# ---- lost requests: reservations that expire unsettled -------------------------------

TTL = 0.3  # Redis waits it out for real; SQLite's clock is moved on
PRICE = Price(input=0.01, output=0.02)


class Clocked:
    """Stores on one state whose clock a test moves on: SQLite's (``clock=``) at once,
    Redis's (``TIME``) by waiting."""

    def __init__(self, make: Callable[[], StateStore], skew: list[float] | None) -> None:
        self._make = make
        self._skew = skew
        self.stores: list[StateStore] = []
        self.store = self.twin()

    def twin(self) -> StateStore:
        """Another replica's store on the same state."""
        s = self._make()
        self.stores.append(s)
        return s

    def now(self) -> float:
        return time.time() + (self._skew[0] if self._skew is not None else 0.0)

    async def wait(self, seconds: float) -> None:
        if self._skew is None:
            await asyncio.sleep(seconds)
        else:
            self._skew[0] += seconds


@pytest.fixture(params=["redis", "sqlite"])
async def clocked(
    request: pytest.FixtureRequest, tmp_path: Path, redis_namespace: str
) -> AsyncIterator[Clocked]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_server_url")
        c = Clocked(lambda: RedisStore(url, namespace=redis_namespace), None)
    else:
        from app.state.sqlite_store import SqliteStore

        skew = [0.0]
        c = Clocked(
            lambda: SqliteStore(tmp_path / "state.db", clock=lambda: time.time() + skew[0]), skew
        )
    yield c
    for s in c.stores:
        await s.close()


def lost_budgets(tenant: str) -> tuple[BudgetCheck, BudgetCheck]:
    return (
        BudgetCheck(f"budget:tenant:{tenant}:tokens:d:2026-12-01", "tokens", 1000, far()),
        BudgetCheck(f"budget:tenant:{tenant}:usd:d:2026-12-01", "usd", 100.0, far()),
    )


def tracked(
    tenant: str = "acme", *, slots: int = 1, pending: bool = True, **kw: object
) -> AdmitRequest:
    """A request the store tracks: a slot, a token and a usd budget, its pending record
    (40 prompt tokens at 0.01 $/token: a lost one is billed 40 tokens and $0.40)."""
    request_id = rid()
    now = time.time()
    rec = LedgerRecord(
        request_id=request_id, client_request_id="client-1", session_id="s-1", tenant=tenant,
        key_id="k1", model_requested="m", endpoint="chat", status="lost", http_status=0,
        prompt_tokens=40, cost_usd=40 * PRICE.input, e2e_s=0.0, started_at=now, ended_at=now,
        ingress="replica-that-dies",
    )  # fmt: skip
    args: dict[str, object] = {
        "concurrency": (ConcurrencyCheck(f"conc:tenant:{tenant}", slots),),
        "budgets": lost_budgets(tenant),
        "prompt_tokens": 40,
        "max_output_tokens": 100,
        "price": PRICE,
        "ttl_s": TTL,
        "pending": rec if pending else None,
        **kw,
    }
    return AdmitRequest(request_id, **args)  # type: ignore[arg-type]


async def test_an_unsettled_request_is_recorded_lost_once_after_its_ttl(clocked: Clocked) -> None:
    s = clocked.store
    tokens, usd = (b.key for b in lost_budgets("acme"))
    a = tracked()
    res = await s.admit(a)
    assert res.admitted and res.reserved_tokens == 140 and res.reserved_usd == pytest.approx(2.4)
    refused = tracked()  # the slot is taken: nothing of it is kept, nor swept later
    assert not (await s.admit(refused)).admitted
    assert await s.sweep_lost() == 0  # not expired yet
    assert await s.budget_used(tokens) == (0, 140)

    await clocked.wait(TTL + 0.15)
    assert await s.sweep_lost() == 1
    (rec,) = await s.query_ledger(LedgerQuery())
    assert a.pending is not None
    assert rec == a.pending.model_copy(update={"ended_at": rec.ended_at, "e2e_s": rec.e2e_s})
    assert (rec.status, rec.http_status, rec.prompt_tokens, rec.completion_tokens) == (
        "lost",
        0,
        40,
        0,
    )
    assert rec.cost_usd == pytest.approx(0.4)
    assert rec.started_at + TTL <= rec.ended_at <= clocked.now()  # ended = the expiry
    assert rec.e2e_s == pytest.approx(rec.ended_at - rec.started_at)
    # billed the prompt (tokens and its input price), nothing of the allowance; no hold left
    assert await s.budget_used(tokens) == (40, 0)
    assert await s.budget_used(usd) == pytest.approx((0.4, 0))
    assert await s.query_ledger(LedgerQuery(request_id=refused.request_id)) == []

    assert await s.sweep_lost() == 0  # once
    assert await s.query_ledger(LedgerQuery()) == [rec]
    assert await s.budget_used(tokens) == (40, 0)
    assert (await s.admit(tracked())).admitted  # the slot is free


@pytest.mark.parametrize(
    ("used_tokens", "used_usd"),
    [(140, 2.4), (0, 0.0)],  # produced its whole allowance / failed before any engine
    ids=["more-than-the-sweep-billed", "less-a-refund"],
)
async def test_a_settle_after_the_sweep_replaces_the_lost_record_and_bills_the_difference(
    clocked: Clocked, used_tokens: int, used_usd: float
) -> None:
    s = clocked.store
    tokens, usd = (b.key for b in lost_budgets("acme"))
    await s.put_key(key("k1"))
    a = tracked()
    res = await s.admit(a)
    await clocked.wait(TTL + 0.15)
    assert await s.sweep_lost() == 1
    assert await s.budget_used(tokens) == (40, 0)
    late = record(a.request_id, ended_at=clocked.now())  # the journal delivers it now
    assert await settle(
        s, a, res, used_tokens=used_tokens, used_usd=used_usd, record=late, key_id="k1"
    )
    (rec,) = await s.query_ledger(LedgerQuery())
    assert rec == late
    assert (rec.request_id, rec.status) == (a.request_id, "ok")
    assert await s.query_ledger(LedgerQuery(request_id=a.request_id)) == [rec]
    assert await s.budget_used(tokens) == (used_tokens, 0)
    assert await s.budget_used(usd) == pytest.approx((used_usd, 0))
    got = await s.get_key("k1")
    assert got is not None and got.last_used_at == rec.ended_at
    # settled for good: a replayed settlement and another sweep change nothing
    assert not await settle(s, a, res, used_tokens=999, used_usd=9.0)
    assert await s.sweep_lost() == 0
    assert await s.query_ledger(LedgerQuery()) == [rec]
    assert await s.budget_used(tokens) == (used_tokens, 0)


async def test_a_request_settled_before_its_expiry_is_never_swept(clocked: Clocked) -> None:
    s = clocked.store
    tokens, _ = (b.key for b in lost_budgets("acme"))
    a = tracked()
    res = await s.admit(a)
    assert await settle(s, a, res, used_tokens=55, used_usd=0.5)
    await clocked.wait(TTL + 0.15)
    assert await s.sweep_lost() == 0
    assert [(r.request_id, r.status) for r in await s.query_ledger(LedgerQuery())] == [
        (a.request_id, "ok")
    ]
    assert await s.budget_used(tokens) == (55, 0)


async def test_a_refreshed_request_is_not_swept_before_its_new_expiry(clocked: Clocked) -> None:
    s = clocked.store
    a = tracked()
    assert (await s.admit(a)).admitted
    await clocked.wait(0.1)
    await s.refresh([a], 0.8)  # expires 0.9 s after admission now, not 0.3 s
    await clocked.wait(0.4)
    assert await s.sweep_lost() == 0
    assert not (await s.admit(tracked())).admitted  # it still holds its slot
    await clocked.wait(0.6)
    assert await s.sweep_lost() == 1
    (rec,) = await s.query_ledger(LedgerQuery())
    assert rec.request_id == a.request_id and rec.status == "lost"
    assert rec.ended_at >= rec.started_at + 0.8  # the refreshed expiry


async def test_an_expired_request_is_not_refreshed_back(clocked: Clocked) -> None:
    s = clocked.store
    a = tracked()
    assert (await s.admit(a)).admitted
    await clocked.wait(TTL + 0.15)
    await s.refresh([a], 60)  # too late: it is lost already
    assert await s.sweep_lost() == 1


async def test_settle_and_sweep_racing_leave_exactly_one_record(clocked: Clocked) -> None:
    s, other = clocked.store, clocked.twin()
    tokens, _ = (b.key for b in lost_budgets("acme"))
    a = tracked()
    res = await s.admit(a)
    await clocked.wait(TTL + 0.15)
    settled, _ = await asyncio.gather(
        settle(s, a, res, used_tokens=55, used_usd=0.5), other.sweep_lost()
    )
    assert settled  # first, or after the sweep: the settlement's record wins either way
    (rec,) = await s.query_ledger(LedgerQuery())
    assert rec.status == "ok"
    assert await s.budget_used(tokens) == (55, 0)
    assert await other.sweep_lost() == 0


async def test_replicas_sweeping_at_once_write_each_record_once(clocked: Clocked) -> None:
    replicas = [clocked.store, clocked.twin(), clocked.twin()]
    lost = [tracked(t, slots=10) for t in ["acme", "globex", "acme", "initech", "acme"] * 2]
    for n, a in enumerate(lost):
        assert (await replicas[n % 3].admit(a)).admitted
    await clocked.wait(TTL + 0.15)
    counts = await asyncio.gather(*(r.sweep_lost() for r in replicas))
    assert sum(counts) == 10
    records = await clocked.store.query_ledger(LedgerQuery())
    assert sorted(r.request_id for r in records) == sorted(a.request_id for a in lost)
    assert {r.status for r in records} == {"lost"}
    tokens, _ = (b.key for b in lost_budgets("acme"))
    assert await clocked.store.budget_used(tokens) == (6 * 40, 0)


async def test_sweep_takes_at_most_limit_records(clocked: Clocked) -> None:
    s = clocked.store
    lost = [tracked(t, slots=5) for t in ("acme", "globex", "acme")]
    for a in lost:
        assert (await s.admit(a)).admitted
    await clocked.wait(TTL + 0.15)
    assert await s.sweep_lost(limit=2) == 2
    assert len(await s.query_ledger(LedgerQuery())) == 2
    assert await s.sweep_lost(limit=0) == 0
    assert await s.sweep_lost() == 1
    assert await s.sweep_lost() == 0
    records = await s.query_ledger(LedgerQuery())
    assert sorted(r.tenant for r in records) == ["acme", "acme", "globex"]


async def test_requests_without_a_hold_or_a_pending_record_are_not_tracked(
    clocked: Clocked,
) -> None:
    s = clocked.store
    rpm = (RateCheck("rate:tenant:acme:requests", "requests", 100),)
    rates_only = tracked(concurrency=(), budgets=(), rates=rpm)  # holds nothing to expire
    no_record = tracked(pending=False)
    for a in (rates_only, no_record):
        assert (await s.admit(a)).admitted
    await clocked.wait(TTL + 0.15)
    assert await s.sweep_lost() == 0
    assert await s.query_ledger(LedgerQuery()) == []
    assert await s.budget_used(lost_budgets("acme")[0].key) == (0, 0)


async def test_a_lost_request_raises_its_keys_last_use(clocked: Clocked) -> None:
    s = clocked.store
    await s.put_key(key("k1"))
    a = tracked()
    assert (await s.admit(a)).admitted
    await clocked.wait(TTL + 0.15)
    assert await s.sweep_lost() == 1
    (rec,) = await s.query_ledger(LedgerQuery())
    got = await s.get_key("k1")
    assert got is not None and got.last_used_at == rec.ended_at


# ---- Redis only: replicas and failures -----------------------------------------------


async def test_two_replicas_share_one_budget_exactly(
    redis_server_url: str, redis_namespace: str
) -> None:
    replicas = [RedisStore(redis_server_url, namespace=redis_namespace) for _ in range(2)]
    bud = budget(limit=5000)
    prompt, minimum = 10, 10
    settled: list[int] = []

    async def loop(n: int) -> None:
        store = replicas[n % 2]
        for i in itertools.count():
            req = AdmitRequest(
                rid(), budgets=(bud,), prompt_tokens=prompt,
                max_output_tokens=20 + (n + i) % 30, min_output_tokens=minimum,
            )  # fmt: skip
            res = await store.admit(req)
            if not res.admitted:
                assert res.reason == "budget"
                return
            assert prompt + minimum <= res.reserved_tokens <= prompt + req.max_output_tokens
            await asyncio.sleep(0)
            assert await settle(store, req, res, used_tokens=res.reserved_tokens)
            settled.append(res.reserved_tokens)

    try:
        await asyncio.gather(*(loop(n) for n in range(16)))
        used, reserved = await replicas[0].budget_used(bud.key)
        assert reserved == 0
        assert used == sum(settled) <= bud.limit
        assert bud.limit - used < prompt + minimum  # nobody was refused while budget remained
        assert len(await replicas[1].query_ledger(LedgerQuery())) == len(settled)
    finally:
        for r in replicas:
            await r.close()


async def test_unreachable_redis_raises_store_unavailable() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = RedisStore(f"redis://:hunter2@127.0.0.1:{port}/0", timeout_s=0.2)
    assert "hunter2" not in store.url
    try:
        for call in (
            store.ping(),
            store.admit(AdmitRequest(rid(), rates=(RPM,))),
            store.get_key("k1"),
            store.query_ledger(LedgerQuery()),
        ):
            with pytest.raises(StoreUnavailable) as err:
                await call
            assert "hunter2" not in str(err.value)
    finally:
        await store.close()
