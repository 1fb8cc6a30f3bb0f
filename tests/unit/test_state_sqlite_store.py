"""SqliteStore specifics beyond the shared contract (tests/unit/test_state_contract.py):
the WAL is checkpointed off the request path and stays bounded under a busy writer."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

import app.state.sqlite_store as sqlite_store
from app.state.protocol import (
    AdmitRequest,
    AdmitResult,
    BudgetCheck,
    ConcurrencyCheck,
    LedgerQuery,
    RateCheck,
    SettleRequest,
)
from app.state.records import LedgerRecord
from app.state.sqlite_store import SqliteStore


def _record(rid: str) -> LedgerRecord:
    now = time.time()
    return LedgerRecord(
        request_id=rid,
        tenant="t",
        model_requested="m",
        endpoint="chat",
        status="ok",
        http_status=200,
        e2e_s=0.1,
        started_at=now,
        ended_at=now,
    )


async def _busy_writer(store: SqliteStore, n: int) -> None:
    for i in range(n):
        admit = AdmitRequest(f"r{i}", rates=(RateCheck("rate:x", "requests", 10**9),))
        await store.admit(admit)
        await store.settle(SettleRequest(admit, AdmitResult(True), 1, 0.0, _record(f"r{i}")))


def _wal_frames(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        _busy, log, _done = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(log)
    finally:
        db.close()


async def test_requests_never_checkpoint_and_the_wal_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    # This store's checkpointer sleeps through the test: only requests could checkpoint.
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_EVERY_S", 3600.0)
    store = SqliteStore(path)
    await _busy_writer(store, 400)
    written = _wal_frames(path)
    assert written >= 400  # nothing checkpointed and restarted the log
    autocheckpoint = await store._run(
        lambda db: db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    )
    assert autocheckpoint == 0
    # A replica whose checkpointer runs often (the same code, a short interval) restarts
    # the shared WAL: the next writer starts the log over.
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_EVERY_S", 0.05)
    sibling = SqliteStore(path)
    await sibling.budget_used("any")  # opens its connection and starts its checkpointer
    await asyncio.sleep(0.3)
    await _busy_writer(store, 1)
    assert _wal_frames(path) < written / 10
    await sibling.close()
    await store.close()


async def test_close_stops_the_checkpoint_thread(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    await store.ping()
    thread = store._checkpointer
    assert thread is not None and thread.is_alive()
    await store.close()
    thread.join(timeout=5)
    assert not thread.is_alive()


async def test_memory_store_has_no_checkpoint_thread() -> None:
    store = SqliteStore(":memory:")
    await store.ping()
    assert store._checkpointer is None
    await store.close()


# ---- lost requests -------------------------------------------------------------------


def _pending(rid: str, started_at: float) -> LedgerRecord:
    return _record(rid).model_copy(
        update={"status": "lost", "http_status": 0, "prompt_tokens": 9, "started_at": started_at}
    )


async def _pending_rows(store: SqliteStore) -> list[tuple[str, float]]:
    rows = await store._run(lambda db: db.execute("SELECT request_id, expires FROM pending"))
    return [(str(r), float(e)) for r, e in rows]


async def test_the_next_process_sweeps_what_a_killed_one_left(tmp_path: Path) -> None:
    """A replica dies holding a slot and a budget: the next store on the file records
    the request lost exactly at its expiry, bills its prompt and frees its slot."""
    t0 = time.time()
    now = [t0]
    conc = (ConcurrencyCheck("conc:tenant:t", 1),)
    bud = (BudgetCheck("budget:tenant:t:tokens:d:2026-12-01", "tokens", 100, t0 + 3600),)
    dead = SqliteStore(tmp_path / "s.db", clock=lambda: now[0])
    admit = AdmitRequest(
        "r1", concurrency=conc, budgets=bud, prompt_tokens=9, max_output_tokens=50,
        ttl_s=30.0, pending=_pending("r1", t0 - 0.5),
    )  # fmt: skip
    assert (await dead.admit(admit)).admitted
    assert await _pending_rows(dead) == [("r1", t0 + 30.0)]
    # the replica is killed: nothing of it runs any more; the file is what survives
    store = SqliteStore(tmp_path / "s.db", clock=lambda: now[0])
    now[0] = t0 + 29.0
    assert await store.sweep_lost() == 0
    assert not (await store.admit(AdmitRequest("r2", concurrency=conc))).admitted
    now[0] = t0 + 30.0  # expiry is inclusive, as for the slots
    assert await store.sweep_lost() == 1
    (rec,) = await store.query_ledger(LedgerQuery())
    assert (rec.request_id, rec.status, rec.prompt_tokens) == ("r1", "lost", 9)
    assert rec.ended_at == t0 + 30.0 and rec.e2e_s == pytest.approx(30.5)
    assert await store.budget_used(bud[0].key) == (9.0, 0.0)
    assert await _pending_rows(store) == []
    assert (await store.admit(AdmitRequest("r3", concurrency=conc))).admitted
    await store.close()
    await dead.close()


async def test_settle_deletes_the_pending_row_and_refresh_moves_it(tmp_path: Path) -> None:
    now = [time.time()]
    store = SqliteStore(tmp_path / "s.db", clock=lambda: now[0])
    conc = (ConcurrencyCheck("conc:tenant:t", 5),)
    a, b = (
        AdmitRequest(r, concurrency=conc, ttl_s=10.0, pending=_pending(r, now[0]))
        for r in ("a", "b")
    )
    untracked = AdmitRequest("c", rates=(RateCheck("rate:x", "requests", 10),), pending=a.pending)
    for req in (a, b, untracked):
        assert (await store.admit(req)).admitted
    assert sorted(await _pending_rows(store)) == [("a", now[0] + 10.0), ("b", now[0] + 10.0)]
    now[0] += 4.0
    await store.refresh([a, b], 10.0)
    assert sorted(await _pending_rows(store)) == [("a", now[0] + 10.0), ("b", now[0] + 10.0)]
    assert await store.settle(SettleRequest(a, AdmitResult(True), 1, 0.0, _record("a")))
    assert await _pending_rows(store) == [("b", now[0] + 10.0)]
    await store.close()
