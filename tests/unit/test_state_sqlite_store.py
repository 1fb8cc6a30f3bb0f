"""SqliteStore specifics beyond the shared contract (tests/unit/test_state_contract.py):
the WAL is checkpointed off the request path and stays bounded under a busy writer."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

import app.state.sqlite_store as sqlite_store
from app.state.protocol import AdmitRequest, AdmitResult, RateCheck, SettleRequest
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
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_EVERY_S", 0.05)
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    await _busy_writer(store, 400)
    written = _wal_frames(path)
    await asyncio.sleep(0.3)  # a few background RESTART checkpoints
    await _busy_writer(store, 1)  # the next writer starts the log over
    assert _wal_frames(path) < written / 10
    autocheckpoint = await store._run(
        lambda db: db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    )
    assert autocheckpoint == 0
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
