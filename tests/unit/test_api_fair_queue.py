"""The fair queue in the ingress pipeline (app.api.stages.admit → app.fairness.queue),
without Ray: a real Layer 1 (SQLite and a real Redis), scripted pools of one engine
slot. Asserted on order, counts, statuses and ledger records, never on time."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.admin.service import AdminService
from app.engine.protocol import EngineLoad
from app.fairness.queue import PoolQueue, QueueSettings
from app.state.protocol import LedgerQuery
from app.state.records import LedgerRecord, Limits
from tests.unit.test_api_generation import (
    GUARDED,
    TENANT,
    Harness,
    Result,
    Script,
    call,
    chat,
    make,
)


def _queue(h: Harness) -> PoolQueue:
    assert h.flow.fair is not None
    q = h.flow.fair.of("a", 1)
    assert q is not None
    return q


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the queue never reached the expected state")


async def _tenant(h: Harness, name: str, **limits: Any) -> list[tuple[bytes, bytes]]:
    admin = AdminService(h.gatekeeper.store)
    await admin.create_tenant(name, Limits(**limits))
    issued = await admin.create_key(name)
    return [*GUARDED, (b"authorization", f"Bearer {issued.secret}".encode())]


async def _records(h: Harness, *tenants: str) -> list[LedgerRecord]:
    for _ in range(200):  # the last settlements land on the next loop turns
        if h.gatekeeper.gate.live == 0 and not h.flow.in_flight:
            break
        await asyncio.sleep(0.01)
    await h.gatekeeper.gate.drain()
    out: list[LedgerRecord] = []
    for tenant in tenants:
        out += await h.gatekeeper.store.query_ledger(LedgerQuery(tenant=tenant))
    return out


@pytest.fixture(params=["sqlite", "redis"])
def state_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "redis":
        return str(request.getfixturevalue("redis_server_url"))
    return f"sqlite:///{tmp_path / 'state.db'}"


async def test_a_flooding_tenant_leaves_another_served_in_fair_order(
    tmp_path: Path, state_url: str
) -> None:
    """One slot. Noisy sends six, then quiet two, all inside their limits. FIFO would
    serve quiet 7th and 8th; VTC (output charged at the end) alternates them in: quiet
    arrives lifted to noisy's counter, and noisy's first answer already put it ahead."""
    hold = asyncio.Event()
    h = await make(tmp_path, {"a": Script(2, hold=hold)}, state_url=state_url, slots=1)
    run = uuid.uuid4().hex[:8]
    noisy, quiet = f"noisy-{run}", f"quiet-{run}"
    creds = {noisy: await _tenant(h, noisy, max_concurrent=10), quiet: await _tenant(h, quiet)}
    q = _queue(h)
    tasks: list[asyncio.Task[Result]] = []
    for i, who in enumerate([noisy] * 6 + [quiet] * 2):
        body = chat(True, max_tokens=2)
        tasks.append(asyncio.create_task(call(h, body, headers=creds[who], rid=f"r{run}{i}")))
        await _until(lambda n=i: q.running == 1 and q.waiting() == n)  # arrivals in order
    hold.set()
    results = await asyncio.gather(*tasks)
    served = [s.request.tenant for s in h.pools.streams]
    assert served == [noisy, quiet, noisy, quiet, noisy, noisy, noisy, noisy]
    assert [r.status for r in results] == [200] * 8
    records = await _records(h, noisy, quiet)
    assert sorted((r.tenant, r.status) for r in records) == sorted(
        [(noisy, "ok")] * 6 + [(quiet, "ok")] * 2
    )
    route = results[-1].headers[b"x-switchyard-route"].decode()
    assert "band=standard" in route and "queue=" in route and "vtc=" in route
    assert q.counter(noisy) > q.counter(quiet)


async def test_a_shed_request_gets_503_with_retry_after_one_shed_record_and_nothing_held(
    tmp_path: Path, state_url: str
) -> None:
    """One slot, one place in the queue: the third request is shed (503 pool_full),
    ends in one ledger record with status shed, and holds no reservation or
    concurrency unit after; the two before it are served."""
    hold = asyncio.Event()
    h = await make(
        tmp_path, {"a": Script(2, hold=hold)}, state_url=state_url, slots=1,
        fair=QueueSettings(max_waiting=1),
    )  # fmt: skip
    run = uuid.uuid4().hex[:8]
    tenant = f"t-{run}"
    creds = await _tenant(h, tenant, max_concurrent=3, daily_tokens=10_000)
    q = _queue(h)
    first = asyncio.create_task(call(h, chat(True), headers=creds, rid=f"a{run}"))
    await _until(lambda: q.running == 1)
    second = asyncio.create_task(call(h, chat(True), headers=creds, rid=f"b{run}"))
    await _until(lambda: q.waiting() == 1)
    shed = await call(h, chat(True), headers=creds, rid=f"c{run}")
    assert shed.status == 503
    assert int(shed.headers[b"retry-after"]) >= 1
    error = json.loads(shed.body)["error"]
    assert (error["code"], error["type"]) == ("pool_full", "server_error")
    assert set(error) == {"message", "type", "param", "code"}
    assert "band=standard" in shed.headers[b"x-switchyard-route"].decode()
    # its concurrency unit is free again: with max_concurrent=3, a fourth is admitted
    # (and shed: the queue is still full) rather than refused with 429
    fourth = await call(h, chat(True), headers=creds, rid=f"d{run}")
    assert (fourth.status, json.loads(fourth.body)["error"]["code"]) == (503, "pool_full")
    hold.set()
    results = await asyncio.gather(first, second)
    assert [r.status for r in results] == [200, 200]
    records = {r.request_id: r for r in await _records(h, tenant)}
    assert {rid: (r.status, r.http_status) for rid, r in records.items()} == {
        f"a{run}": ("ok", 200), f"b{run}": ("ok", 200),
        f"c{run}": ("shed", 503), f"d{run}": ("shed", 503),
    }  # fmt: skip
    assert records[f"c{run}"].completion_tokens == 0 and records[f"c{run}"].cost_usd == 0
    assert h.gatekeeper.gate.live == 0
    assert q.running == 0 and q.waiting() == 0
    assert q.shed == {("standard", "pool_full"): 2}


@pytest.mark.parametrize(
    ("limits", "asked", "band"),
    [
        ({}, None, "standard"),
        ({}, b"batch", "batch"),  # lowering is always allowed
        ({}, b"interactive", "standard"),  # raising is not, by default
        ({"raise_priority": True}, b"interactive", "interactive"),
        ({"priority": "batch"}, None, "batch"),
    ],
)
async def test_the_band_comes_from_the_key_and_the_priority_header(
    tmp_path: Path, limits: dict[str, Any], asked: bytes | None, band: str
) -> None:
    h = await make(tmp_path, {"a": Script(2)}, slots=1)
    creds = await _tenant(h, f"t-{uuid.uuid4().hex[:8]}", **limits)
    headers = creds + ([(b"x-switchyard-priority", asked)] if asked is not None else [])
    result = await call(h, chat(False), headers=headers)
    assert result.status == 200
    assert f"band={band}" in result.headers[b"x-switchyard-route"].decode()


async def test_an_unknown_priority_is_400_naming_the_header(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(2)}, slots=1)
    result = await call(h, chat(False), headers=[*GUARDED, (b"x-switchyard-priority", b"vip")])
    error = json.loads(result.body)["error"]
    assert (result.status, error["param"]) == (400, "x-switchyard-priority")
    assert h.pools.streams == []


async def test_a_client_that_leaves_while_waiting_ends_in_one_499_record(
    tmp_path: Path, state_url: str
) -> None:
    hold = asyncio.Event()
    h = await make(tmp_path, {"a": Script(2, hold=hold)}, state_url=state_url, slots=1)
    run = uuid.uuid4().hex[:8]
    tenant = f"t-{run}"
    creds = await _tenant(h, tenant, max_concurrent=5, daily_tokens=10_000)
    q = _queue(h)
    first = asyncio.create_task(call(h, chat(True), headers=creds, rid=f"a{run}"))
    await _until(lambda: q.running == 1)
    leaving = asyncio.create_task(call(h, chat(True), headers=creds, rid=f"b{run}"))
    await _until(lambda: q.waiting() == 1)
    leaving.cancel()  # the client goes: Ray Serve cancels its handler
    await leaving
    await _until(lambda: q.waiting() == 0)
    hold.set()
    assert (await first).status == 200
    records = {r.request_id: (r.status, r.http_status) for r in await _records(h, tenant)}
    assert records == {f"a{run}": ("ok", 200), f"b{run}": ("client_closed", 499)}
    assert h.gatekeeper.gate.live == 0 and q.running == 0


async def test_a_replica_stopping_ends_its_waiters_with_503_shutting_down(tmp_path: Path) -> None:
    hold = asyncio.Event()
    h = await make(tmp_path, {"a": Script(2, hold=hold)}, slots=1)
    q = _queue(h)
    first = asyncio.create_task(call(h, chat(True), rid="first1"))
    await _until(lambda: q.running == 1)
    waiter = asyncio.create_task(call(h, chat(True), rid="waiter1"))
    await _until(lambda: q.waiting() == 1)
    await h.flow.shutdown(grace_s=0.05)  # both are cut: the running one and the waiter
    got = await waiter
    assert got.status == 503
    assert json.loads(got.body)["error"]["code"] == "shutting_down"
    await first
    records = {r.request_id: (r.status, r.http_status) for r in await _records(h, TENANT)}
    assert records["waiter1"] == ("error", 503)
    assert len(records) == 2 and h.gatekeeper.gate.live == 0
    assert (q.running, q.waiting()) == (0, 0)


async def test_a_full_engine_on_the_first_delta_holds_the_next_request_with_slots_free(
    tmp_path: Path, state_url: str
) -> None:
    """Three slots, but the first answer says its engine is full (other ingress replicas
    or clients): the second request waits for the first to end instead of joining the
    engine's own queue, then is served; one hold is counted and shown nowhere as an
    error."""
    rest = asyncio.Event()
    full = EngineLoad(running=4, waiting=5, kv_cache_usage=0.4)
    h = await make(tmp_path, {"a": Script(2, rest=rest, load=full)}, state_url=state_url, slots=3)
    run = uuid.uuid4().hex[:8]
    tenant = f"t-{run}"
    creds = await _tenant(h, tenant, max_concurrent=5)
    assert h.flow.fair is not None
    q = h.flow.fair.of("a", 3)
    assert q is not None
    first = asyncio.create_task(call(h, chat(True), headers=creds, rid=f"a{run}"))
    await _until(lambda: q.engines.counts["held"] == 1)
    second = asyncio.create_task(call(h, chat(True), headers=creds, rid=f"b{run}"))
    await _until(lambda: q.waiting() == 1)
    assert (q.running, q.limit()) == (1, 1) and len(h.pools.streams) == 1
    rest.set()
    results = [await first, await second]
    assert [r.status for r in results] == [200, 200] and len(h.pools.streams) == 2
    assert q.engines.counts == {"held": 1, "stale": 0}
    records = await _records(h, tenant)
    assert sorted(r.status for r in records) == ["ok", "ok"]


async def test_a_prefill_cap_holds_the_next_request_until_the_first_token_came(
    tmp_path: Path, state_url: str
) -> None:
    """Three slots, a prefill cap of one token: the first request's prompt waits for its
    first token, so the second request waits at the ingress (not in the engine) until
    that token comes, then is served."""
    hold = asyncio.Event()
    settings = QueueSettings(max_prefill_tokens=1)
    h = await make(tmp_path, {"a": Script(2, hold=hold)}, state_url=state_url, slots=3,
                   fair=settings)  # fmt: skip
    run = uuid.uuid4().hex[:8]
    tenant = f"t-{run}"
    creds = await _tenant(h, tenant, max_concurrent=5)
    assert h.flow.fair is not None
    q = h.flow.fair.of("a", 3)
    assert q is not None and q.tokens.caps.prefill == 1
    first = asyncio.create_task(call(h, chat(True), headers=creds, rid=f"a{run}"))
    await _until(lambda: q.running == 1 and q.tokens.pending_prefill > 1)
    second = asyncio.create_task(call(h, chat(True), headers=creds, rid=f"b{run}"))
    await _until(lambda: q.waiting() == 1)
    assert len(h.pools.streams) == 1
    hold.set()
    results = [await first, await second]
    assert [r.status for r in results] == [200, 200] and len(h.pools.streams) == 2
    assert (q.running, q.tokens.pending_prefill, q.tokens.reserved_kv) == (0, 0, 0)
    records = await _records(h, tenant)
    assert sorted(r.status for r in records) == ["ok", "ok"]
