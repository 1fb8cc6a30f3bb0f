"""SqliteStore: the embedded state store for a single node.

Every ingress replica on the node opens the same database file (WAL mode); ``admit``
and ``settle`` each run as one ``BEGIN IMMEDIATE`` transaction, which SQLite
serialises across processes, so replicas on one node share limits exactly. The rules
and their parameters are in ``app.state.protocol``. Calls run on one worker thread per
store, never on the event loop.

Checkpoints: the connection that serves requests never checkpoints the WAL itself
(``wal_autocheckpoint=0``; SQLite's default would stall every ~50th request for a
checkpoint and its fsync). A background thread with its own connection runs a RESTART
checkpoint every ``CHECKPOINT_EVERY_S``: writers wait only while the last second's
frames are copied, and the WAL starts over, so it stays bounded under continuous load
(a PASSIVE checkpoint never catches up with a busy writer, and the WAL would grow
without end).

The store is its connection (here: the schema, the worker thread, the checkpoints, the
ledger query) and four parts, split as the Redis store is: the records (keys,
adapters, tenants, limits; ``app.state.sqlite_records``), admission and settlement
(``app.state.sqlite_admission``, whose docstring names its tables), sessions
(``app.state.sqlite_sessions``) and stored responses (``app.state.sqlite_responses``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from app.state.protocol import (
    LedgerQuery,
    StoreUnavailable,
)
from app.state.records import (
    LedgerRecord,
)
from app.state.sqlite_admission import SqliteAdmission
from app.state.sqlite_records import SqliteRecords
from app.state.sqlite_responses import RESPONSE_SCHEMA, SqliteResponses
from app.state.sqlite_sessions import SESSION_SCHEMA, SqliteSessions

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (kind TEXT, id TEXT, json TEXT, PRIMARY KEY (kind, id));
CREATE TABLE IF NOT EXISTS key_used (id TEXT PRIMARY KEY, ts REAL);
CREATE TABLE IF NOT EXISTS buckets (key TEXT PRIMARY KEY, tokens REAL, ts REAL);
CREATE TABLE IF NOT EXISTS slots (key TEXT, request_id TEXT, expires REAL,
                                  PRIMARY KEY (key, request_id));
CREATE TABLE IF NOT EXISTS budgets (key TEXT PRIMARY KEY, used REAL, expires_at REAL);
CREATE TABLE IF NOT EXISTS holds (key TEXT, request_id TEXT, amount REAL, expires REAL,
                                  PRIMARY KEY (key, request_id));
CREATE TABLE IF NOT EXISTS settled (request_id TEXT PRIMARY KEY, ts REAL);
CREATE TABLE IF NOT EXISTS ledger (seq INTEGER PRIMARY KEY AUTOINCREMENT,
                                   request_id TEXT UNIQUE, tenant TEXT, ended_at REAL,
                                   json TEXT);
CREATE INDEX IF NOT EXISTS ledger_tenant ON ledger (tenant, ended_at);
CREATE INDEX IF NOT EXISTS ledger_time ON ledger (ended_at);
CREATE TABLE IF NOT EXISTS pending (request_id TEXT PRIMARY KEY, expires REAL, record TEXT,
                                    holds TEXT);
CREATE INDEX IF NOT EXISTS pending_expires ON pending (expires);
"""

CHECKPOINT_EVERY_S = 1.0
WAL_SIZE_LIMIT = 64 * 1024 * 1024  # the WAL file is truncated back to this after a reset


class SqliteStore(SqliteAdmission, SqliteRecords, SqliteSessions, SqliteResponses):
    def __init__(self, path: Path | str, *, clock: Callable[[], float] = time.time) -> None:
        self.url = f"sqlite:///{path}"
        self._path = str(path)
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        self._db: sqlite3.Connection | None = None
        self._stop = threading.Event()
        self._checkpointer: threading.Thread | None = None

    # ---- plumbing ------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            if self._path != ":memory:":
                Path(self._path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=5000")
            db.executescript(_SCHEMA + SESSION_SCHEMA + RESPONSE_SCHEMA)
            if self._path != ":memory:":
                db.execute("PRAGMA wal_autocheckpoint=0")
                db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
                self._checkpointer = threading.Thread(
                    target=self._checkpoint_loop, name="sqlite-checkpoint", daemon=True
                )
                self._checkpointer.start()
            self._db = db
        return self._db

    def _checkpoint_loop(self) -> None:
        db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA busy_timeout=5000")
        try:
            while not self._stop.wait(CHECKPOINT_EVERY_S):
                with contextlib.suppress(sqlite3.Error):
                    db.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
        finally:
            db.close()

    def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            out = fn(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return out

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._tx, fn)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"state store {self._path}: {exc}") from exc

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A read outside ``BEGIN IMMEDIATE`` (WAL: it never blocks a writer)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, lambda: fn(self._conn()))
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"state store {self._path}: {exc}") from exc

    async def ping(self) -> None:
        await self._run(lambda db: db.execute("SELECT 1").fetchone())

    async def close(self) -> None:
        self._stop.set()

        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await asyncio.get_running_loop().run_in_executor(self._executor, shut)
        self._executor.shutdown(wait=False)

    # ---- ledger --------------------------------------------------------------------

    async def query_ledger(self, query: LedgerQuery) -> list[LedgerRecord]:
        where: list[str] = ["1=1"]
        args: list[str | float] = []
        if query.tenant is not None:
            where.append("tenant=?")
            args.append(query.tenant)
        if query.request_id is not None:
            where.append("request_id=?")
            args.append(query.request_id)
        if query.session_id is not None:
            where.append("json_extract(json, '$.session_id')=?")
            args.append(query.session_id)
        if query.since is not None:
            where.append("ended_at>=?")
            args.append(query.since)
        if query.until is not None:
            where.append("ended_at<?")
            args.append(query.until)
        sql = f"SELECT seq, json FROM ledger WHERE {' AND '.join(where)} ORDER BY seq"
        if query.limit is not None:
            sql = f"SELECT json FROM ({sql} DESC LIMIT {int(query.limit)}) ORDER BY seq DESC"
        rows = await self._run(lambda db: [str(r[-1]) for r in db.execute(sql, args)])
        return [LedgerRecord.model_validate_json(j) for j in rows]
