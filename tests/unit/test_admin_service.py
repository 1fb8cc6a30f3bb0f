"""AdminService against a real SqliteStore: keys, tenants, limits, usage summaries."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.admin.service import AdminError, AdminService, UsageRow, summarize
from app.admin.views import parse_time, public_key_view
from app.gateway.keys import parse_key, verify_secret
from app.state.protocol import AdmitRequest, AdmitResult, LedgerQuery, SettleRequest
from app.state.records import LedgerRecord, LedgerStatus, Limits
from app.state.sqlite_store import SqliteStore


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "s.db")
    yield s
    await s.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(store: SqliteStore, clock: Clock) -> AdminService:
    return AdminService(store, clock=clock)


def ledger(
    request_id: str,
    tenant: str,
    model: str,
    *,
    served: str | None = None,
    status: LedgerStatus = "ok",
    prompt: int = 0,
    completion: int = 0,
    cached: int = 0,
    cost: float = 0.0,
    gpu_s: float | None = None,
    ended: float = 1000.0,
) -> LedgerRecord:
    return LedgerRecord(
        request_id=request_id,
        tenant=tenant,
        model_requested=model,
        model_served=served,
        endpoint="/v1/chat/completions",
        status=status,
        http_status=200 if status == "ok" else 500,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        cost_usd=cost,
        gpu_seconds=gpu_s,
        gpu_cost_usd=None if gpu_s is None else gpu_s / 1000,
        e2e_s=0.5,
        started_at=ended - 0.5,
        ended_at=ended,
    )


async def settle(store: SqliteStore, record: LedgerRecord) -> None:
    written = await store.settle(
        SettleRequest(
            admit=AdmitRequest(request_id=record.request_id),
            result=AdmitResult(True),
            used_tokens=record.prompt_tokens + record.completion_tokens,
            used_usd=record.cost_usd,
            record=record,
        )
    )
    assert written


# Hand-computed expectations for these records are in test_summarize_*.
RECORDS = [
    ledger("r1", "acme", "alias", served="llama", prompt=10, completion=5, cached=2, cost=0.01,
           gpu_s=0.4),
    ledger("r2", "acme", "llama", served="llama", status="error", prompt=3, cost=0.001),
    ledger("r3", "acme", "qwen", status="rejected_by_engine", prompt=7, ended=2000.0),
    ledger("r4", "beta", "llama", served="llama", prompt=100, completion=50, cost=0.5, gpu_s=2.0),
    ledger("r5", "beta", "llama", served="llama", status="client_closed", completion=4,
           gpu_s=0.25),
]


# ---- keys -----------------------------------------------------------------------------


async def test_create_key_creates_the_tenant(service: AdminService, clock: Clock) -> None:
    assert await service.list_tenants() == []
    issued = await service.create_key("acme", team="ml", user="ann", name="ci")
    tenants = await service.list_tenants()
    assert [(t.id, t.disabled, t.created_at) for t in tenants] == [("acme", False, clock.now)]
    assert (issued.record.tenant, issued.record.team, issued.record.user) == ("acme", "ml", "ann")


async def test_create_key_for_an_existing_tenant_keeps_it(service: AdminService) -> None:
    await service.create_tenant("acme", Limits(rpm=7))
    await service.update_tenant("acme", disabled=True)
    await service.create_key("acme")
    [tenant] = await service.list_tenants()
    assert tenant.disabled and tenant.limits.rpm == 7


async def test_secret_verifies_and_is_not_stored(service: AdminService, store: SqliteStore) -> None:
    issued = await service.create_key("acme", limits=Limits(tpm=1000))
    parsed = parse_key(issued.secret)
    assert parsed is not None and parsed.key_id == issued.record.id
    stored = await store.get_key(parsed.key_id)
    assert stored is not None
    assert verify_secret(parsed.secret, stored.salt, stored.digest)
    tampered = parsed.secret[:-1] + ("B" if parsed.secret.endswith("A") else "A")
    assert not verify_secret(tampered, stored.salt, stored.digest)
    assert parsed.secret not in stored.model_dump_json()
    assert stored.prefix == issued.secret.split("_", 1)[0]
    assert stored.limits == Limits(tpm=1000)


async def test_public_view_hides_salt_digest_and_secret(service: AdminService) -> None:
    issued = await service.create_key("acme")
    view = public_key_view(issued.record)
    assert "salt" not in view and "digest" not in view
    assert issued.secret not in str(view)
    assert view["prefix"] == issued.record.prefix


async def test_revoke_sets_revoked_at_once(service: AdminService, clock: Clock) -> None:
    issued = await service.create_key("acme")
    clock.now += 10
    first = await service.revoke_key(issued.record.id)
    assert first.revoked_at == clock.now
    clock.now += 10
    second = await service.revoke_key(issued.record.id)
    assert second.revoked_at == first.revoked_at  # idempotent: the first time stays
    [listed] = await service.list_keys("acme")
    assert listed.revoked_at == first.revoked_at


async def test_rotate_keeps_id_and_limits_and_replaces_the_secret(
    service: AdminService, store: SqliteStore
) -> None:
    old = await service.create_key("acme", name="ci", limits=Limits(rpm=5, daily_usd=1.5))
    new = await service.rotate_key(old.record.id)
    assert new.secret != old.secret
    assert (new.record.id, new.record.limits, new.record.name) == (
        old.record.id,
        Limits(rpm=5, daily_usd=1.5),
        "ci",
    )
    stored = await store.get_key(old.record.id)
    assert stored is not None
    old_parsed, new_parsed = parse_key(old.secret), parse_key(new.secret)
    assert old_parsed is not None and new_parsed is not None
    assert not verify_secret(old_parsed.secret, stored.salt, stored.digest)
    assert verify_secret(new_parsed.secret, stored.salt, stored.digest)


async def test_rotate_of_a_revoked_key_is_refused(service: AdminService) -> None:
    issued = await service.create_key("acme")
    await service.revoke_key(issued.record.id)
    with pytest.raises(AdminError, match="revoked"):
        await service.rotate_key(issued.record.id)


@pytest.mark.parametrize("action", ["revoke_key", "rotate_key"])
async def test_unknown_key_is_an_admin_error(service: AdminService, action: str) -> None:
    with pytest.raises(AdminError, match=r"^no key 'nope'"):
        await getattr(service, action)("nope")


async def test_expiry_in_the_past_is_refused(service: AdminService, clock: Clock) -> None:
    with pytest.raises(AdminError, match="past"):
        await service.create_key("acme", expires_at=clock.now - 1)
    issued = await service.create_key("acme", expires_at=clock.now + 60)
    assert issued.record.expires_at == clock.now + 60


async def test_list_keys_filters_by_tenant(service: AdminService) -> None:
    a = await service.create_key("acme")
    b = await service.create_key("beta")
    assert [k.id for k in await service.list_keys("acme")] == [a.record.id]
    assert {k.id for k in await service.list_keys()} == {a.record.id, b.record.id}


# ---- tenants and limits -------------------------------------------------------------------


async def test_create_tenant_twice_raises(service: AdminService) -> None:
    await service.create_tenant("acme")
    with pytest.raises(AdminError, match="exists already"):
        await service.create_tenant("acme")


async def test_update_tenant_disables_and_sets_limits(service: AdminService) -> None:
    await service.create_tenant("acme", Limits(rpm=1))
    disabled = await service.update_tenant("acme", disabled=True)
    assert disabled.disabled and disabled.limits == Limits(rpm=1)
    changed = await service.update_tenant("acme", limits=Limits(tpm=9))
    assert changed.disabled and changed.limits == Limits(tpm=9)  # limits replaced
    [stored] = await service.list_tenants()
    assert stored == changed
    assert not (await service.update_tenant("acme", disabled=False)).disabled


async def test_update_unknown_tenant_raises(service: AdminService) -> None:
    with pytest.raises(AdminError, match=r"^no tenant"):
        await service.update_tenant("ghost", disabled=True)


@pytest.mark.parametrize(
    ("level", "ok"), [("team", True), ("user", True), ("tenant", False), ("", False)]
)
async def test_set_limits_validates_the_level(service: AdminService, level: str, ok: bool) -> None:
    if not ok:
        with pytest.raises(AdminError, match="level"):
            await service.set_limits(level, "acme", "ml", Limits(rpm=3))
        assert await service.list_limits() == []
        return
    record = await service.set_limits(level, "acme", "ml", Limits(rpm=3))
    assert record.scope == f"{level}:acme/ml"
    assert await service.list_limits() == [record]


# ---- usage --------------------------------------------------------------------------------


def test_summarize_hand_computed() -> None:
    rows = summarize(RECORDS)
    assert [(r.tenant, r.model) for r in rows] == [
        ("acme", "llama"),  # r1 (served as llama) + r2
        ("acme", "qwen"),  # not served: the requested model
        ("beta", "llama"),
    ]
    acme_llama, acme_qwen, beta_llama = rows
    assert acme_llama.model_dump(exclude={"cost_usd", "gpu_cost_usd"}) == dict(
        tenant="acme", model="llama", requests=2, errors=1, prompt_tokens=13,
        completion_tokens=5, cached_tokens=2, gpu_seconds=0.4,  # r2 has no GPU time
    )  # fmt: skip
    assert acme_llama.gpu_cost_usd == pytest.approx(0.0004)
    assert (beta_llama.gpu_seconds, beta_llama.gpu_cost_usd) == pytest.approx((2.25, 0.00225))
    assert acme_llama.cost_usd == pytest.approx(0.011)
    assert (acme_qwen.requests, acme_qwen.errors, acme_qwen.prompt_tokens) == (1, 1, 7)
    assert (beta_llama.requests, beta_llama.errors) == (2, 1)
    assert (beta_llama.prompt_tokens, beta_llama.completion_tokens) == (100, 54)
    assert beta_llama.cost_usd == pytest.approx(0.5)


def test_summarize_nothing() -> None:
    assert summarize([]) == []


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (LedgerQuery(), {("acme", "llama"): 2, ("acme", "qwen"): 1, ("beta", "llama"): 2}),
        (LedgerQuery(tenant="beta"), {("beta", "llama"): 2}),
        (LedgerQuery(since=1500.0), {("acme", "qwen"): 1}),
        (LedgerQuery(until=2000.0), {("acme", "llama"): 2, ("beta", "llama"): 2}),
        (LedgerQuery(tenant="acme", since=2000.0, until=2000.5), {("acme", "qwen"): 1}),
        (LedgerQuery(tenant="nobody"), {}),
    ],
)
async def test_usage_from_the_ledger(
    service: AdminService,
    store: SqliteStore,
    query: LedgerQuery,
    expected: dict[tuple[str, str], int],
) -> None:
    for record in RECORDS:
        await settle(store, record)
    rows = await service.usage(query)
    assert {(r.tenant, r.model): r.requests for r in rows} == expected
    records = await service.usage_records(query)
    assert len(records) == sum(expected.values())
    assert summarize(records) == rows


async def test_usage_rows_match_summarize(service: AdminService, store: SqliteStore) -> None:
    for record in RECORDS:
        await settle(store, record)
    assert await service.usage(LedgerQuery()) == summarize(RECORDS)
    assert all(isinstance(r, UsageRow) for r in await service.usage(LedgerQuery()))


# ---- parse_time ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1700000000", 1_700_000_000.0),
        ("1700000000.5", 1_700_000_000.5),
        ("2024-01-01", 1_704_067_200.0),
        ("2024-01-01T00:00:00", 1_704_067_200.0),  # no timezone: UTC
        ("2024-01-01T00:00:00Z", 1_704_067_200.0),
        ("2024-01-01T02:00:00+02:00", 1_704_067_200.0),
        ("30m", 10_000.0 - 1800),
        ("24h", 10_000.0 - 86400),
        ("7d", 10_000.0 - 7 * 86400),
        ("90s", 10_000.0 - 90),
    ],
)
def test_parse_time(text: str, expected: float) -> None:
    assert parse_time(text, now=10_000.0) == pytest.approx(expected)


def test_parse_time_future_durations() -> None:
    assert parse_time("1d", now=100.0, future=True) == 100.0 + 86400


@pytest.mark.parametrize("text", ["yesterday", "", "7 days", "24x", "nan", "2024-13-01"])
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time(text, now=0.0)
