"""The session part of the StateStore contract (app/state/protocol.py), on both backends:
records by session, known/open/cancelled state, the cancel feed two replicas follow,
and idle sessions claimed exactly once."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.state.protocol import (
    AdmitRequest,
    AdmitResult,
    LedgerQuery,
    SessionKey,
    SettleRequest,
    StateStore,
)
from app.state.records import LedgerRecord
from tests.unit import test_state_contract as contract
from tests.unit.test_state_contract import TTL, Clocked, record, rid, tracked

store = contract.store  # the contract's fixtures: both backends
clocked = contract.clocked


async def settle_in(store: StateStore, session: str | None, tenant: str = "acme") -> LedgerRecord:
    request_id = rid()
    rec = record(request_id, tenant=tenant).model_copy(update={"session_id": session})
    ok = await store.settle(SettleRequest(AdmitRequest(request_id), AdmitResult(True), 15, 0, rec))
    assert ok
    return rec


async def test_a_sessions_records_are_found_within_its_tenant(store: StateStore) -> None:
    a1 = await settle_in(store, "s1")
    await settle_in(store, "s2")
    await settle_in(store, None)
    other = await settle_in(store, "s1", tenant="globex")
    a2 = await settle_in(store, "s1")
    assert await store.query_ledger(LedgerQuery(tenant="acme", session_id="s1")) == [a1, a2]
    assert await store.query_ledger(LedgerQuery(tenant="globex", session_id="s1")) == [other]
    newest = await store.query_ledger(LedgerQuery(tenant="acme", session_id="s1", limit=1))
    assert newest == [a2]
    assert await store.query_ledger(LedgerQuery(tenant="acme", session_id="none")) == []
    with pytest.raises(ValueError, match="within one tenant"):
        LedgerQuery(session_id="s1")


async def test_a_session_is_known_once_a_call_is_admitted_or_recorded(store: StateStore) -> None:
    assert not (await store.session_state("acme", "s1")).known
    now = time.time()
    assert await store.session_call("acme", "s1", now) is None
    state = await store.session_state("acme", "s1")
    assert (state.known, state.open, state.cancelled_until) == (True, True, None)
    assert state.last_at == pytest.approx(now)
    await store.session_call("acme", "s1", now - 50)  # last activity never goes back
    assert (await store.session_state("acme", "s1")).last_at == pytest.approx(now)
    assert not (await store.session_state("globex", "s1")).known  # per tenant
    rec = await settle_in(store, "s2")  # a record alone makes it known (and active then)
    state = await store.session_state("acme", "s2")
    assert state.known and state.last_at == pytest.approx(rec.ended_at)


async def test_cancel_marks_a_known_session_until_its_end(store: StateStore) -> None:
    until = time.time() + 60
    assert not await store.cancel_session("acme", "ghost", until)  # unknown: nothing written
    assert not (await store.session_state("acme", "ghost")).known
    await store.session_call("acme", "s1", time.time())
    await store.session_call("globex", "s1", time.time())
    assert await store.cancel_session("acme", "s1", until)
    assert (await store.session_state("acme", "s1")).cancelled_until == pytest.approx(until)
    assert await store.session_call("acme", "s1", time.time()) == pytest.approx(until)
    assert await store.session_call("globex", "s1", time.time()) is None  # another tenant's


async def test_a_cancellation_ends_when_its_time_is_up(store: StateStore) -> None:
    await store.session_call("acme", "s1", time.time())
    assert await store.cancel_session("acme", "s1", time.time() + 1.0)
    assert await store.session_call("acme", "s1", time.time()) is not None
    await asyncio.sleep(1.3)
    assert await store.session_call("acme", "s1", time.time()) is None
    assert (await store.session_state("acme", "s1")).cancelled_until is None


async def test_every_replica_reads_every_cancellation_from_its_cursor(clocked: Clocked) -> None:
    one, two = clocked.store, clocked.twin()
    _, c1 = await one.session_cancels(None, 0.1)  # the feed's end, at start-up
    _, c2 = await two.session_cancels(None, 0.1)
    assert await one.session_cancels(c1, 0.1) == ([], c1)  # nothing yet: waits, same cursor
    for sid in ("s1", "s2"):
        await one.session_call("acme", sid, time.time())
        assert await one.cancel_session("acme", sid, time.time() + 60)
    wanted = [SessionKey("acme", "s1"), SessionKey("acme", "s2")]
    got1, c1 = await one.session_cancels(c1, 0.1)
    got2, c2 = await two.session_cancels(c2, 0.1)
    assert got1 == wanted and got2 == wanted
    assert (await one.session_cancels(c1, 0.1))[0] == []
    _, late = await two.session_cancels(None, 0.1)  # a replica starting now: only what follows
    await one.cancel_session("acme", "s1", time.time() + 60)
    assert (await two.session_cancels(late, 0.1))[0] == [SessionKey("acme", "s1")]


async def test_a_waiting_read_returns_when_a_cancellation_arrives(clocked: Clocked) -> None:
    one, two = clocked.store, clocked.twin()
    await one.session_call("acme", "s1", time.time())
    _, cursor = await two.session_cancels(None, 0.1)
    reader = asyncio.ensure_future(two.session_cancels(cursor, 60.0))
    await asyncio.sleep(0.05)
    await one.cancel_session("acme", "s1", time.time() + 60)
    # a read that waited out its 60 s wait would not be done within 20 s
    found, _ = await asyncio.wait_for(reader, 20.0)
    assert found == [SessionKey("acme", "s1")]


async def test_idle_sessions_are_claimed_once(clocked: Clocked) -> None:
    one, two = clocked.store, clocked.twin()
    now = time.time()
    await one.session_call("acme", "old", now - 100)
    await one.session_call("globex", "old", now - 100)
    await one.session_call("acme", "new", now)
    claims = await asyncio.gather(
        one.close_idle_sessions(now - 50), two.close_idle_sessions(now - 50)
    )
    got = sorted((k.tenant, k.session_id) for c in claims for k in c)
    assert got == [("acme", "old"), ("globex", "old")]  # each once, whoever got it
    assert await one.close_idle_sessions(now - 50) == []
    state = await one.session_state("acme", "old")
    assert state.known and not state.open
    await one.session_call("acme", "old", now)  # used again: open again
    assert (await one.session_state("acme", "old")).open
    assert sorted(k.session_id for k in await one.close_idle_sessions(now + 1)) == ["new", "old"]


async def test_a_replaced_lost_record_counts_once_in_its_session(clocked: Clocked) -> None:
    s = clocked.store
    a = tracked()  # its pending record is of session s-1
    res = await s.admit(a)
    await clocked.wait(TTL + 0.15)
    assert await s.sweep_lost() == 1
    (lost,) = await s.query_ledger(LedgerQuery(tenant="acme", session_id="s-1"))
    assert lost.status == "lost"
    late = record(a.request_id, ended_at=clocked.now()).model_copy(update={"session_id": "s-1"})
    assert await s.settle(SettleRequest(a, res, 60, 0.0, late))
    assert await s.query_ledger(LedgerQuery(tenant="acme", session_id="s-1")) == [late]
