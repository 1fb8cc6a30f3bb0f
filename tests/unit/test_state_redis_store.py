"""RedisStore specifics beyond the shared contract (tests/unit/test_state_contract.py):
hash tags per tenant, the key-to-tenant mapping shared by replicas, the per-tenant
ledgers, and a run of the gateway's calls on a one-node Redis Cluster whose scripts
must stay inside one slot."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

import app.state.redis_ledger as redis_ledger
import app.state.redis_store as redis_store
from app.gateway.plan import build_plan, levels
from app.request import Caller
from app.state.protocol import (
    AdmitRequest,
    AdmitResult,
    BudgetCheck,
    ConcurrencyCheck,
    LedgerQuery,
    RateCheck,
    SettleRequest,
    StoreUnavailable,
)
from app.state.records import KeyRecord, LedgerRecord, Limits, LimitsRecord, TenantRecord
from app.state.redis_store import RedisStore, check_owner, tag
from benchmarks.local_redis import RedisProcess, answers_ping, free_port, stop_process

_ids = itertools.count()


def rid() -> str:
    return f"rr-{next(_ids)}"


def key(kid: str, tenant: str, **kw: object) -> KeyRecord:
    return KeyRecord.model_validate(
        {"id": kid, "prefix": "sk-sy-" + kid, "salt": "00", "digest": "ff", "tenant": tenant,
         "created_at": 1.0, **kw}
    )  # fmt: skip


def record(request_id: str, tenant: str, ended_at: float | None = None) -> LedgerRecord:
    end = time.time() if ended_at is None else ended_at
    return LedgerRecord(
        request_id=request_id,
        tenant=tenant,
        model_requested="m",
        endpoint="/v1/chat/completions",
        status="ok",
        http_status=200,
        e2e_s=0.1,
        started_at=end - 0.1,
        ended_at=end,
    )


@pytest.fixture
async def store(redis_server_url: str, redis_namespace: str) -> AsyncIterator[RedisStore]:
    s = RedisStore(redis_server_url, namespace=redis_namespace)
    yield s
    await s.close()


# ---- hash tags ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "owner"),
    [
        ("rate:tenant:acme:requests", ("tenant", "acme")),
        ("rate:tenant:a:b:tokens", ("tenant", "a:b")),
        ("conc:tenant:acme", ("tenant", "acme")),
        ("budget:tenant:acme:tokens:d:2026-11-29", ("tenant", "acme")),
        ("budget:tenant:a:b:usd:m:2026-11", ("tenant", "a:b")),
        ("rate:team:acme/ml:requests", ("tenant", "acme")),
        ("budget:user:acme/ann/x:usd:d:2026-11-29", ("tenant", "acme")),
        ("conc:user:acme/ann", ("tenant", "acme")),
        ("rate:key:ab12cd34ef56:tokens", ("key", "ab12cd34ef56")),
        ("budget:key:ab12:tokens:m:2026-11", ("key", "ab12")),
        ("conc:team:red", ("other", "conc:team:red")),  # no tenant in it
        ("budget:tenant:acme:tokens:d", ("other", "budget:tenant:acme:tokens:d")),
        ("rate:x", ("other", "rate:x")),
    ],
)
def test_check_owner_parses_the_plan_formats(check: str, owner: tuple[str, str]) -> None:
    assert check_owner(check) == owner


def test_tags_are_distinct_non_empty_and_hash_the_whole_tenant() -> None:
    tenants = ["acme", "", "%", "%7D", "}", "a}b", "a{b", "a/b", "{x}"]
    tags = [tag(t) for t in tenants]
    assert len(set(tags)) == len(tenants)
    for t in tags:  # Redis hashes what is between the first { and the next }: the whole tag
        inner = t[1:-1]
        assert t.startswith("{") and t.endswith("}") and inner and "}" not in inner
        assert key_slot(f"sy:{t}:rate:x".encode()) == key_slot(inner.encode())
    assert tag("acme") == "{acme}"


def test_namespace_with_braces_is_refused() -> None:
    with pytest.raises(ValueError, match="braces"):
        RedisStore("redis://127.0.0.1:1/0", namespace="a{b}")


async def test_check_keys_live_under_their_tenants_tag(store: RedisStore) -> None:
    raw = store._redis
    ns = store._ns
    await store.put_key(key("k1", "acme"))
    checks = (
        RateCheck("rate:key:k1:requests", "requests", 10),
        RateCheck("rate:team:acme/ml:tokens", "tokens", 1000),
    )
    conc = (ConcurrencyCheck("conc:tenant:acme", 5),)
    bud = (
        BudgetCheck("budget:user:acme/ann:tokens:d:2026-11-29", "tokens", 100, time.time() + 60),
    )
    req = AdmitRequest(rid(), rates=checks, concurrency=conc, budgets=bud, prompt_tokens=3)
    assert (await store.admit(req)).admitted
    day = "budget:user:acme/ann:tokens:d:2026-11-29"
    assert set(await raw.keys(f"{ns}:*")) == {
        f"{ns}:key:k1",
        f"{ns}:keys",
        f"{ns}:{{acme}}:rate:key:k1:requests",
        f"{ns}:{{acme}}:rate:team:acme/ml:tokens",
        f"{ns}:{{acme}}:conc:tenant:acme",
        f"{ns}:{{acme}}:{day}:held",
        f"{ns}:{{acme}}:{day}:amt",
    }
    rec = record(req.request_id, "acme")
    assert await store.settle(SettleRequest(req, AdmitResult(True), 3, 0.0, rec, "k1"))
    assert set(await raw.keys(f"{ns}:*")) == {
        f"{ns}:key:k1",
        f"{ns}:keys",
        f"{ns}:ledger:tenants",
        f"{ns}:{{acme}}:rate:key:k1:requests",
        f"{ns}:{{acme}}:rate:team:acme/ml:tokens",
        f"{ns}:{{acme}}:{day}",  # used; the released :held and :amt are gone
        f"{ns}:{{acme}}:settled:{req.request_id}",
        f"{ns}:{{acme}}:ledger",
        f"{ns}:{{acme}}:ledger:ids",
        f"{ns}:{{acme}}:keys:last_used",
    }
    assert await raw.smembers(f"{ns}:ledger:tenants") == {"acme"}
    entry = await raw.hget(f"{ns}:{{acme}}:ledger:ids", req.request_id)
    assert [e for e, _ in await raw.xrange(f"{ns}:{{acme}}:ledger")] == [entry]


async def test_a_fresh_replica_maps_a_key_check_to_the_same_bucket(
    store: RedisStore, redis_server_url: str, redis_namespace: str
) -> None:
    await store.put_key(key("k9", "globex"))
    rpm = RateCheck("rate:key:k9:requests", "requests", 2)
    assert (await store.admit(AdmitRequest(rid(), rates=(rpm,)))).admitted
    other = RedisStore(redis_server_url, namespace=redis_namespace)  # knows no key yet
    try:
        got = await other.admit(AdmitRequest(rid(), rates=(rpm,)))
        assert got.admitted and got.rates[0].remaining == 0  # the same bucket: 2 - 2
        refused = await store.admit(AdmitRequest(rid(), rates=(rpm,)))
        assert not refused.admitted and refused.scope_key == rpm.key
        assert await other._redis.exists(f"{redis_namespace}:{{globex}}:{rpm.key}")
    finally:
        await other.close()


async def test_a_key_without_record_gets_a_tag_of_its_own(store: RedisStore) -> None:
    conc = ConcurrencyCheck("conc:key:ghost", 1)
    assert (await store.admit(AdmitRequest(rid(), concurrency=(conc,)))).admitted
    assert await store._redis.exists(f"{store._ns}:{{key:ghost}}:conc:key:ghost")
    assert not (await store.admit(AdmitRequest(rid(), concurrency=(conc,)))).admitted


async def test_load_principal_checks_what_it_remembered_against_the_key(
    store: RedisStore, redis_server_url: str, redis_namespace: str
) -> None:
    for t in ("acme", "globex"):
        await store.put_tenant(TenantRecord(id=t))
        for team in ("red", "blue"):
            limits = Limits(rpm=len(t + team))
            await store.put_limits(LimitsRecord(level="team", tenant=t, name=team, limits=limits))
    await store.put_key(key("k1", "acme", team="red"))
    p = await store.load_principal(key_id="k1")
    assert p.team is not None and p.team.scope == "team:acme/red"
    # another replica moves the key: the remembered tenant/team are stale now
    other = RedisStore(redis_server_url, namespace=redis_namespace)
    try:
        await other.put_key(key("k1", "globex", team="blue"))
    finally:
        await other.close()
    p = await store.load_principal(key_id="k1")
    assert p.tenant is not None and p.tenant.id == "globex"
    assert p.team is not None and p.team.scope == "team:globex/blue"


async def test_get_and_list_keys_read_last_use_from_each_tenant(store: RedisStore) -> None:
    await store.put_key(key("ka", "acme"))
    await store.put_key(key("kg", "globex"))
    await store.put_key(key("kn", "globex"))
    for kid, tenant, end in (("ka", "acme", 11.0), ("kg", "globex", 22.0)):
        req = AdmitRequest(rid())
        rec = record(req.request_id, tenant, ended_at=end)
        assert await store.settle(SettleRequest(req, AdmitResult(True), 0, 0.0, rec, kid))
    got = {k.id: k.last_used_at for k in await store.list_keys()}
    assert got == {"ka": 11.0, "kg": 22.0, "kn": None}
    assert [k.id for k in await store.list_keys("globex")] == ["kg", "kn"]
    ka = await store.get_key("ka")
    assert ka is not None and ka.last_used_at == 11.0


# ---- per-tenant ledgers --------------------------------------------------------------------


async def test_ledgers_merge_across_tenants_and_pages(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_ledger, "_PAGE", 3)
    tenants = ["acme", "globex", "anon", "acme", "acme", "globex", "acme", "anon", "acme"] * 2
    written = []
    for i, t in enumerate(tenants):
        req = AdmitRequest(rid())
        rec = record(req.request_id, t, ended_at=5000.0 + i)
        assert await store.settle(SettleRequest(req, AdmitResult(True), 0, 0.0, rec))
        written.append(rec)

    def ends(recs: list[LedgerRecord]) -> list[int]:
        return [int(r.ended_at) - 5000 for r in recs]

    assert await store.query_ledger(LedgerQuery()) == written  # settle order, all tenants
    assert ends(await store.query_ledger(LedgerQuery(limit=4))) == [17, 16, 15, 14]
    assert ends(await store.query_ledger(LedgerQuery(limit=30))) == list(range(17, -1, -1))
    since = await store.query_ledger(LedgerQuery(since=5013))
    assert ends(since) == [13, 14, 15, 16, 17]
    assert ends(await store.query_ledger(LedgerQuery(until=5004, limit=2))) == [3, 2]
    acme = [i for i, t in enumerate(tenants) if t == "acme"]
    assert ends(await store.query_ledger(LedgerQuery(tenant="acme"))) == acme
    assert ends(await store.query_ledger(LedgerQuery(tenant="anon", limit=3))) == [16, 11, 7]
    assert await store.query_ledger(LedgerQuery(limit=0)) == []
    # a tenant that was never created as a record still has its ledger found by id
    anon = written[2]
    assert await store.query_ledger(LedgerQuery(request_id=anon.request_id)) == [anon]
    assert sorted(await store._redis.smembers(f"{store._ns}:ledger:tenants")) == [
        "acme",
        "anon",
        "globex",
    ]


async def test_ledger_entry_ids_increase_within_a_stream(store: RedisStore) -> None:
    for _ in range(20):
        req = AdmitRequest(rid())
        assert await store.settle(
            SettleRequest(req, AdmitResult(True), 0, 0.0, record(req.request_id, "acme"))
        )
    entries = await store._redis.xrange(f"{store._ns}:{{acme}}:ledger")
    order = [tuple(int(p) for p in eid.split("-")) for eid, _ in entries]
    assert len(order) == 20 and order == sorted(set(order))
    index = await store._redis.hgetall(f"{store._ns}:{{acme}}:ledger:ids")
    by_id = {LedgerRecord.model_validate_json(f["record"]).request_id: e for e, f in entries}
    assert index == by_id


async def test_a_record_already_in_the_ledger_is_not_written_again(store: RedisStore) -> None:
    a, b = AdmitRequest(rid()), AdmitRequest(rid())
    first = record("shared-id", "acme", ended_at=1.0)
    second = record("shared-id", "acme", ended_at=2.0)
    assert await store.settle(SettleRequest(a, AdmitResult(True), 0, 0.0, first))
    assert await store.settle(SettleRequest(b, AdmitResult(True), 0, 0.0, second))
    assert await store.query_ledger(LedgerQuery()) == [first]
    assert await store.query_ledger(LedgerQuery(request_id="shared-id")) == [first]


# ---- lost requests: the pending entries ------------------------------------------------


def pending(request_id: str, tenant: str, key_id: str | None = None) -> LedgerRecord:
    now = time.time()
    return LedgerRecord(
        request_id=request_id, tenant=tenant, key_id=key_id, model_requested="m",
        endpoint="chat", status="lost", http_status=0, prompt_tokens=7, e2e_s=0.0,
        started_at=now, ended_at=now,
    )  # fmt: skip


async def test_pending_entries_live_under_the_tenants_tag(store: RedisStore) -> None:
    raw, ns = store._redis, store._ns
    conc = (ConcurrencyCheck("conc:tenant:acme", 5),)
    day = "budget:tenant:acme:tokens:d:2026-12-01"
    bud = (BudgetCheck(day, "tokens", 100, time.time() + 60),)
    request_id = rid()
    req = AdmitRequest(
        request_id, concurrency=conc, budgets=bud, prompt_tokens=7,
        pending=pending(request_id, "acme"),
    )  # fmt: skip
    assert (await store.admit(req)).admitted
    assert set(await raw.keys(f"{ns}:*")) == {
        f"{ns}:{{acme}}:conc:tenant:acme",
        f"{ns}:{{acme}}:{day}:held",
        f"{ns}:{{acme}}:{day}:amt",
        f"{ns}:{{acme}}:pending",
        f"{ns}:{{acme}}:pending:info",
        f"{ns}:pending:tenants",
    }
    expiry = await raw.zscore(f"{ns}:{{acme}}:pending", req.request_id)
    slot = await raw.zscore(f"{ns}:{{acme}}:conc:tenant:acme", req.request_id)
    assert expiry == slot  # the same expiry as the reservation
    assert await raw.smembers(f"{ns}:pending:tenants") == {"acme"}
    rec = record(req.request_id, "acme")
    assert await store.settle(SettleRequest(req, AdmitResult(True), 7, 0.0, rec))
    keys = set(await raw.keys(f"{ns}:*"))
    assert f"{ns}:{{acme}}:pending" not in keys and f"{ns}:{{acme}}:pending:info" not in keys
    assert await store.sweep_lost() == 0  # an empty tenant: forgotten
    assert await raw.smembers(f"{ns}:pending:tenants") == set()
    again = AdmitRequest(rid(), concurrency=conc, pending=pending("y", "acme"))
    assert (await store.admit(again)).admitted
    assert await raw.smembers(f"{ns}:pending:tenants") == {"acme"}


async def test_a_tenant_an_admit_reaches_during_the_sweep_stays_listed(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep read the tenant's zset empty, then an admit added an entry before the
    sweep forgot the tenant: the tenant is listed again, so the entry is swept later."""
    raw, ns = store._redis, store._ns
    conc = (ConcurrencyCheck("conc:tenant:acme", 5),)
    request_id = rid()
    req = AdmitRequest(request_id, concurrency=conc, ttl_s=0.2, pending=pending(request_id, "acme"))
    assert (await store.admit(req)).admitted

    async def read_as_empty(keys: list[str], args: list[object], client: object) -> object:
        return await real(keys=[keys[0] + ":nothing", keys[1]], args=args, client=client)

    real = store._pending_due
    monkeypatch.setattr(store, "_pending_due", read_as_empty)
    assert await store.sweep_lost() == 0
    assert await raw.smembers(f"{ns}:pending:tenants") == {"acme"}
    monkeypatch.setattr(store, "_pending_due", real)
    await asyncio.sleep(0.3)
    assert await store.sweep_lost() == 1


async def test_a_pending_entry_without_its_record_is_dropped(store: RedisStore) -> None:
    raw, ns = store._redis, store._ns
    await raw.zadd(f"{ns}:{{acme}}:pending", {"ghost": 1.0})
    await raw.sadd(f"{ns}:pending:tenants", "acme")
    assert await store.sweep_lost() == 0
    assert await raw.exists(f"{ns}:{{acme}}:pending") == 0
    assert await store.query_ledger(LedgerQuery()) == []


async def test_a_sweep_releases_the_lost_requests_slot_and_holds(store: RedisStore) -> None:
    """What expiry alone would leave: the request id in the slot zset and the hold."""
    raw, ns = store._redis, store._ns
    conc = (ConcurrencyCheck("conc:tenant:acme", 5),)
    day = "budget:tenant:acme:tokens:d:2026-12-01"
    bud = (BudgetCheck(day, "tokens", 100, time.time() + 60),)
    request_id = rid()
    req = AdmitRequest(
        request_id, concurrency=conc, budgets=bud, prompt_tokens=7, max_output_tokens=3,
        ttl_s=0.2, pending=pending(request_id, "acme"),
    )  # fmt: skip
    assert (await store.admit(req)).admitted
    await asyncio.sleep(0.3)
    assert await raw.zscore(f"{ns}:{{acme}}:conc:tenant:acme", request_id) is not None
    assert await store.sweep_lost() == 1
    assert await raw.zscore(f"{ns}:{{acme}}:conc:tenant:acme", request_id) is None
    assert await raw.zscore(f"{ns}:{{acme}}:{day}:held", request_id) is None
    assert await raw.hget(f"{ns}:{{acme}}:{day}:amt", request_id) is None
    assert await raw.hget(f"{ns}:{{acme}}:{day}", "used") == "7"
    assert await raw.exists(f"{ns}:{{acme}}:settled:{request_id}") == 1
    assert await raw.smembers(f"{ns}:ledger:tenants") == {"acme"}


# ---- a one-node Redis Cluster ----------------------------------------------------------


def _start_cluster_node(exe: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    """One node on free ports (the cluster bus gets its own: port + 10000, the default,
    may be past 65535), holding every slot; None when it did not come up."""
    port = free_port()
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(workdir), "--cluster-enabled", "yes", "--cluster-port", str(free_port()),
            "--cluster-config-file", str(workdir / f"nodes-{port}.conf")]  # fmt: skip
    with (workdir / f"redis-{port}.log").open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline and not answers_ping(port):
        time.sleep(0.05)
    if proc.poll() is None and answers_ping(port):
        with redis.Redis(port=port, decode_responses=True) as client:
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            while time.monotonic() < deadline:
                if client.cluster("INFO")["cluster_state"] == "ok":
                    return proc, port
                time.sleep(0.05)
    stop_process(proc)
    return None


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis-server --cluster-enabled yes`` holding all 16384 slots: a real cluster node
    that refuses CROSSSLOT commands, and (with the ``#!lua`` shebang) scripts that touch
    keys outside the slot of their KEYS."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed: run `make services` first", pytrace=False)
    workdir = tmp_path_factory.mktemp("redis-cluster")
    for _ in range(3):  # another process may take a free port before redis binds it
        started = _start_cluster_node(exe, workdir)
        if started is not None:
            proc, port = started
            try:
                yield f"redis://127.0.0.1:{port}"
            finally:
                stop_process(proc)
            return
    pytest.fail(f"no Redis Cluster node came up; see the logs in {workdir}", pytrace=False)


@pytest.fixture
async def strict_store(
    cluster_url: str, redis_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[RedisStore]:
    """A store whose scripts carry ``#!lua``: the node then refuses any key a script
    touches outside the slot of its KEYS."""
    plain = redis_store._lua
    monkeypatch.setattr(
        redis_store, "_lua", lambda name, prelude=True: "#!lua\n" + plain(name, prelude=prelude)
    )
    s = RedisStore(cluster_url, namespace=redis_namespace)
    yield s
    await s.close()


async def test_the_cluster_node_enforces_one_slot_per_script(strict_store: RedisStore) -> None:
    r = strict_store._redis
    with pytest.raises(redis.exceptions.ResponseError, match="same slot"):
        await r.eval(
            "#!lua\nredis.call('SET', KEYS[1], 1)\nreturn redis.call('GET', 'b')", 1, "{a}x"
        )
    with pytest.raises(redis.exceptions.ResponseError, match="same slot"):
        await r.eval("return 1", 2, "{a}x", "{b}x")


async def test_gateway_calls_stay_in_one_slot_per_tenant(
    strict_store: RedisStore, cluster_url: str
) -> None:
    store, ns = strict_store, strict_store._ns
    every = Limits(rpm=100, tpm=100_000, max_concurrent=5, daily_tokens=10_000, monthly_usd=5.0)
    for t in ("acme", "globex"):
        await store.put_tenant(TenantRecord(id=t, limits=every))
        await store.put_limits(LimitsRecord(level="team", tenant=t, name="ml", limits=every))
        await store.put_limits(LimitsRecord(level="user", tenant=t, name="ann", limits=every))
    await store.put_key(key("kacme", "acme", team="ml", user="ann", limits=every))
    await store.put_key(key("kglobex", "globex", team="ml", limits=every))
    callers = [
        Caller(tenant="acme", team="ml", user="ann", key_id="kacme"),
        Caller(tenant="globex", team="ml", key_id="kglobex"),
        Caller(tenant="anon", via="anonymous"),  # no tenant record: a ledger of its own
    ]
    live: list[tuple[Caller, AdmitRequest, AdmitResult]] = []
    for caller in callers:
        p = await store.load_principal(
            key_id=caller.key_id, tenant=caller.tenant, team=caller.team, user=caller.user
        )
        scoped = levels(caller, p) or [(f"tenant:{caller.tenant}", Limits(rpm=10))]
        plan = build_plan(scoped, time.time())
        req = AdmitRequest(
            rid(), rates=plan.rates, concurrency=plan.concurrency, budgets=plan.budgets,
            prompt_tokens=10, max_output_tokens=20,
        )  # fmt: skip
        res = await store.admit(req)
        assert res.admitted, caller
        live.append((caller, req, res))
    assert len(live[0][1].rates) == 8  # key, user, team and tenant buckets: one slot
    await store.refresh([req for _, req, _ in live], 30.0)  # three tenants, one call
    for caller, req, res in live:
        rec = record(req.request_id, caller.tenant)
        assert await store.settle(SettleRequest(req, res, 25, 0.01, rec, caller.key_id))
        for b in req.budgets:
            used, held = await store.budget_used(b.key)
            assert held == 0 and used in (25, 0.01)
    assert len(await store.query_ledger(LedgerQuery())) == 3
    anon_id = live[2][1].request_id
    assert [r.tenant for r in await store.query_ledger(LedgerQuery(request_id=anon_id))] == ["anon"]
    assert [r.tenant for r in await store.query_ledger(LedgerQuery(tenant="globex"))] == ["globex"]
    got = await store.get_key("kacme")
    assert got is not None and got.last_used_at is not None
    assert {k.id for k in await store.list_keys()} == {"kacme", "kglobex"}
    assert {t.id for t in await store.list_tenants()} == {"acme", "globex"}
    assert len(await store.list_limits()) == 4
    # a replica that knows no key: two round trips for the principal, then the same slot
    cold = RedisStore(cluster_url, namespace=ns)
    try:
        warm = await store.load_principal(key_id="kacme")
        assert await cold.load_principal(key_id="kacme") == warm
        plan = build_plan(levels(callers[0], warm), time.time())
        again = AdmitRequest(rid(), rates=plan.rates, budgets=plan.budgets, prompt_tokens=1)
        assert (await cold.admit(again)).admitted
        fresh = RedisStore(cluster_url, namespace=ns)
        try:  # nor does this one: it reads the key record to tag the key's checks
            assert (await fresh.admit(again)).admitted
            assert fresh._key_scopes == {"kacme": ("acme", "ml", "ann")}
        finally:
            await fresh.close()
    finally:
        await cold.close()
    # every tagged key is in its tenant's slot
    for k in await store._redis.keys(f"{ns}:*"):
        if "{" in k:
            tenant = k.split("{", 1)[1].split("}", 1)[0]
            assert key_slot(k.encode()) == key_slot(tenant.encode()), k
    # a request that mixes tenants is refused by the cluster, not run across slots
    mixed = AdmitRequest(
        rid(),
        rates=(RateCheck("rate:tenant:acme:requests", "requests", 10),
               RateCheck("rate:tenant:globex:requests", "requests", 10)),
    )  # fmt: skip
    with pytest.raises(StoreUnavailable, match="same slot"):
        await store.admit(mixed)


async def test_sweep_stays_in_one_slot_per_tenant(strict_store: RedisStore) -> None:
    store, ns = strict_store, strict_store._ns
    every = Limits(rpm=100, max_concurrent=5, daily_tokens=10_000, monthly_usd=5.0)
    callers = [
        Caller(tenant="acme", team="ml", key_id="kacme"),
        Caller(tenant="globex", key_id="kglobex"),
    ]
    await store.put_key(key("kacme", "acme", team="ml", limits=every))
    await store.put_key(key("kglobex", "globex", limits=every))
    await store.put_limits(LimitsRecord(level="team", tenant="acme", name="ml", limits=every))
    admits = []
    for caller in callers * 2:  # the second of each is settled, the first is lost
        p = await store.load_principal(key_id=caller.key_id)
        plan = build_plan(levels(caller, p), time.time())
        request_id = rid()
        req = AdmitRequest(
            request_id, rates=plan.rates, concurrency=plan.concurrency, budgets=plan.budgets,
            prompt_tokens=7, max_output_tokens=10, ttl_s=0.2,
            pending=pending(request_id, caller.tenant, caller.key_id),
        )  # fmt: skip
        res = await store.admit(req)
        assert res.admitted, caller
        admits.append((caller, req, res))
    for caller, req, res in admits[2:]:
        rec = record(req.request_id, caller.tenant)
        assert await store.settle(SettleRequest(req, res, 17, 0.01, rec, caller.key_id))
    await asyncio.sleep(0.3)
    await store.refresh([req for _, req, _ in admits], 30.0)  # expired: nothing to extend
    assert await store.sweep_lost() == 2
    lost = {r.request_id: r for r in await store.query_ledger(LedgerQuery()) if r.status == "lost"}
    assert set(lost) == {req.request_id for _, req, _ in admits[:2]}
    for b in admits[0][1].budgets:  # the acme budgets: 7 lost + 17 settled tokens, $0.01
        assert await store.budget_used(b.key) == ((24.0, 0.0) if ":tokens:" in b.key
                                                  else (0.01, 0.0))  # fmt: skip
    for k in await store._redis.keys(f"{ns}:*"):
        if "{" in k:
            tenant = k.split("{", 1)[1].split("}", 1)[0]
            assert key_slot(k.encode()) == key_slot(tenant.encode()), k


async def test_a_lost_server_empties_the_pool_so_no_later_call_meets_a_dead_socket(
    redis_process: RedisProcess,
) -> None:
    store = RedisStore(redis_process.url, namespace="pool", timeout_s=0.5)
    try:
        await asyncio.gather(*(store.ping() for _ in range(4)))  # four pooled connections
        pool = store._redis.connection_pool
        assert len(pool._available_connections) == 4
        redis_process.kill()
        with pytest.raises(StoreUnavailable):
            await store.ping()
        assert not any(c.is_connected for c in pool._available_connections)  # all, not one
        redis_process.start()
        await asyncio.gather(*(store.ping() for _ in range(4)))
    finally:
        await store.close()
