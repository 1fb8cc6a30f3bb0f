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

Tables: ``records`` (keys, tenants, team/user limits as JSON), ``key_used``,
``buckets`` (token buckets), ``slots`` (concurrency reservations), ``budgets`` (used
per budget counter) and ``holds`` (budget reservations), ``settled`` (idempotency
markers), ``ledger``, ``pending`` (the record to write if a tracked request is lost:
its expiry follows the reservation's; ``holds`` = JSON ``{"conc": [check key], "budgets":
[[check key, unit, expires_at]]}``, what ``sweep_lost`` releases and bills), and the
session tables of ``app.state.sqlite_sessions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from app.state.protocol import (
    AdmitRequest,
    AdmitResult,
    LedgerQuery,
    RateState,
    SettleRequest,
    StoreUnavailable,
    lost_record,
)
from app.state.records import (
    AdapterRecord,
    KeyRecord,
    LedgerRecord,
    LimitsRecord,
    Principal,
    TenantRecord,
)
from app.state.sqlite_sessions import SESSION_SCHEMA, SqliteSessions, session_seen

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

SETTLED_KEEP_S = 2 * 86400.0
CHECKPOINT_EVERY_S = 1.0
WAL_SIZE_LIMIT = 64 * 1024 * 1024  # the WAL file is truncated back to this after a reset


class SqliteStore(SqliteSessions):
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
            db.executescript(_SCHEMA + SESSION_SCHEMA)
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

    # ---- records -------------------------------------------------------------------

    @staticmethod
    def _put(db: sqlite3.Connection, kind: str, rid: str, json: str) -> None:
        db.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?)", (kind, rid, json))

    @staticmethod
    def _get(db: sqlite3.Connection, kind: str, rid: str) -> str | None:
        row = db.execute("SELECT json FROM records WHERE kind=? AND id=?", (kind, rid)).fetchone()
        return None if row is None else str(row[0])

    @staticmethod
    def _all(db: sqlite3.Connection, kind: str) -> list[str]:
        rows = db.execute("SELECT json FROM records WHERE kind=? ORDER BY id", (kind,))
        return [str(r[0]) for r in rows]

    async def put_key(self, record: KeyRecord) -> None:
        data = record.model_copy(update={"last_used_at": None}).model_dump_json()
        await self._run(lambda db: self._put(db, "key", record.id, data))

    async def get_key(self, key_id: str) -> KeyRecord | None:
        def get(db: sqlite3.Connection) -> KeyRecord | None:
            raw = self._get(db, "key", key_id)
            return None if raw is None else self._with_used(db, KeyRecord.model_validate_json(raw))

        return await self._run(get)

    @staticmethod
    def _with_used(db: sqlite3.Connection, key: KeyRecord) -> KeyRecord:
        row = db.execute("SELECT ts FROM key_used WHERE id=?", (key.id,)).fetchone()
        return key if row is None else key.model_copy(update={"last_used_at": float(row[0])})

    async def list_keys(self, tenant: str | None = None) -> list[KeyRecord]:
        def get(db: sqlite3.Connection) -> list[KeyRecord]:
            keys = [KeyRecord.model_validate_json(j) for j in self._all(db, "key")]
            return [self._with_used(db, k) for k in keys if tenant is None or k.tenant == tenant]

        return await self._run(get)

    async def put_adapter(self, record: AdapterRecord) -> None:
        await self._run(lambda db: self._put(db, "adapter", record.id, record.model_dump_json()))

    async def get_adapter(self, adapter_id: str) -> AdapterRecord | None:
        raw = await self._run(lambda db: self._get(db, "adapter", adapter_id))
        return None if raw is None else AdapterRecord.model_validate_json(raw)

    async def list_adapters(self) -> list[AdapterRecord]:
        rows = await self._run(lambda db: self._all(db, "adapter"))
        return [AdapterRecord.model_validate_json(r) for r in rows]

    async def delete_adapter(self, adapter_id: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            cur = db.execute("DELETE FROM records WHERE kind='adapter' AND id=?", (adapter_id,))
            return cur.rowcount > 0

        return await self._run(delete)

    async def put_tenant(self, record: TenantRecord) -> None:
        await self._run(lambda db: self._put(db, "tenant", record.id, record.model_dump_json()))

    async def get_tenant(self, tenant: str) -> TenantRecord | None:
        raw = await self._run(lambda db: self._get(db, "tenant", tenant))
        return None if raw is None else TenantRecord.model_validate_json(raw)

    async def list_tenants(self) -> list[TenantRecord]:
        rows = await self._run(lambda db: self._all(db, "tenant"))
        return [TenantRecord.model_validate_json(j) for j in rows]

    async def put_limits(self, record: LimitsRecord) -> None:
        await self._run(lambda db: self._put(db, "limits", record.scope, record.model_dump_json()))

    async def list_limits(self) -> list[LimitsRecord]:
        rows = await self._run(lambda db: self._all(db, "limits"))
        return [LimitsRecord.model_validate_json(j) for j in rows]

    async def load_principal(
        self,
        *,
        key_id: str | None = None,
        tenant: str | None = None,
        team: str | None = None,
        user: str | None = None,
    ) -> Principal:
        def load(db: sqlite3.Connection) -> Principal:
            key = None
            t, m, u = tenant, team, user
            if key_id is not None:
                raw = self._get(db, "key", key_id)
                if raw is None:
                    return Principal()
                key = KeyRecord.model_validate_json(raw)
                t, m, u = key.tenant, key.team, key.user
            if t is None:
                return Principal(key=key)
            raw_t = self._get(db, "tenant", t)
            raw_m = self._get(db, "limits", f"team:{t}/{m}") if m else None
            raw_u = self._get(db, "limits", f"user:{t}/{u}") if u else None
            return Principal(
                key=key,
                tenant=None if raw_t is None else TenantRecord.model_validate_json(raw_t),
                team=None if raw_m is None else LimitsRecord.model_validate_json(raw_m),
                user=None if raw_u is None else LimitsRecord.model_validate_json(raw_u),
            )

        return await self._run(load)

    # ---- admission -----------------------------------------------------------------

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        return await self._run(lambda db: self._admit(db, request, self._clock()))

    @staticmethod
    def _bucket(db: sqlite3.Connection, key: str, limit: int, now: float) -> float:
        row = db.execute("SELECT tokens, ts FROM buckets WHERE key=?", (key,)).fetchone()
        if row is None:
            return float(limit)
        return min(float(limit), float(row[0]) + max(0.0, now - float(row[1])) * limit / 60.0)

    @staticmethod
    def _held(db: sqlite3.Connection, key: str, now: float) -> tuple[float, float]:
        db.execute("DELETE FROM holds WHERE key=? AND expires<=?", (key, now))
        used = db.execute("SELECT used FROM budgets WHERE key=?", (key,)).fetchone()
        held = db.execute("SELECT COALESCE(SUM(amount), 0) FROM holds WHERE key=?", (key,))
        return (0.0 if used is None else float(used[0])), float(held.fetchone()[0])

    def _admit(self, db: sqlite3.Connection, r: AdmitRequest, now: float) -> AdmitResult:
        levels = {rc.key: self._bucket(db, rc.key, rc.limit, now) for rc in r.rates}

        def states(taken: dict[str, float]) -> tuple[RateState, ...]:
            out = []
            for rc in r.rates:
                left = levels[rc.key] - taken.get(rc.key, 0.0)
                reset = (rc.limit - left) * 60.0 / rc.limit
                out.append(RateState(rc.kind, rc.limit, max(0, math.floor(left)), reset))
            return tuple(out)

        def refuse(reason: Any, key: str, retry: float) -> AdmitResult:
            return AdmitResult(
                False, reason=reason, scope_key=key, retry_after_s=retry, rates=states({})
            )

        for cc in r.concurrency:
            db.execute("DELETE FROM slots WHERE key=? AND expires<=?", (cc.key, now))
            (live,) = db.execute("SELECT COUNT(*) FROM slots WHERE key=?", (cc.key,)).fetchone()
            if live >= cc.limit:
                return refuse("concurrency", cc.key, 1.0)
        for rc in r.rates:
            if rc.kind == "requests" and levels[rc.key] < 1.0:
                return refuse("requests", rc.key, (1.0 - levels[rc.key]) * 60.0 / rc.limit)
        allowance = r.max_output_tokens
        refusing = None
        for b in r.budgets:
            used, held = self._held(db, b.key, now)
            avail = b.limit - used - held
            if b.unit == "tokens":
                fits = math.floor(avail - r.prompt_tokens)
            elif r.price.output > 0:
                fits = math.floor((avail - r.prompt_tokens * r.price.input) / r.price.output)
            else:
                fits = allowance if avail - r.prompt_tokens * r.price.input >= 0 else -1
            if fits < allowance:
                allowance, refusing = fits, b.key
        if refusing is not None and allowance < min(r.min_output_tokens, r.max_output_tokens):
            return refuse("budget", refusing, 0.0)
        cost = r.prompt_tokens + allowance
        for rc in r.rates:
            if rc.kind == "tokens" and levels[rc.key] < cost:
                retry = 60.0 if cost > rc.limit else (cost - levels[rc.key]) * 60.0 / rc.limit
                return refuse("tokens", rc.key, retry)
        taken = {rc.key: (1.0 if rc.kind == "requests" else float(cost)) for rc in r.rates}
        for rc in r.rates:
            db.execute(
                "INSERT OR REPLACE INTO buckets VALUES (?, ?, ?)",
                (rc.key, levels[rc.key] - taken[rc.key], now),
            )
        expires = now + r.ttl_s
        for cc in r.concurrency:
            db.execute(
                "INSERT OR REPLACE INTO slots VALUES (?, ?, ?)", (cc.key, r.request_id, expires)
            )
        usd = r.prompt_tokens * r.price.input + allowance * r.price.output
        for b in r.budgets:
            db.execute(
                "INSERT INTO budgets VALUES (?, 0, ?) ON CONFLICT(key) DO UPDATE SET "
                "expires_at=excluded.expires_at",
                (b.key, b.expires_at),
            )
            amount = float(cost) if b.unit == "tokens" else usd
            db.execute(
                "INSERT OR REPLACE INTO holds VALUES (?, ?, ?, ?)",
                (b.key, r.request_id, amount, expires),
            )
        if r.tracked:
            assert r.pending is not None
            holds = {
                "conc": [cc.key for cc in r.concurrency],
                "budgets": [[b.key, b.unit, b.expires_at] for b in r.budgets],
            }
            db.execute(
                "INSERT OR REPLACE INTO pending VALUES (?, ?, ?, ?)",
                (r.request_id, expires, r.pending.model_dump_json(), json.dumps(holds)),
            )
        return AdmitResult(
            True,
            allowance=allowance,
            reserved_tokens=cost,
            reserved_usd=usd,
            rates=states(taken),
        )

    async def refresh(self, admits: Sequence[AdmitRequest], ttl_s: float) -> None:
        def extend(db: sqlite3.Connection) -> None:
            now = self._clock()
            for a in admits:
                for cc in a.concurrency:
                    db.execute(
                        "UPDATE slots SET expires=? WHERE key=? AND request_id=?",
                        (now + ttl_s, cc.key, a.request_id),
                    )
                for b in a.budgets:
                    db.execute(
                        "UPDATE holds SET expires=? WHERE key=? AND request_id=?",
                        (now + ttl_s, b.key, a.request_id),
                    )
                if a.tracked:  # live only: an expired one is lost already
                    db.execute(
                        "UPDATE pending SET expires=? WHERE request_id=? AND expires>?",
                        (now + ttl_s, a.request_id, now),
                    )
            db.execute("DELETE FROM budgets WHERE expires_at<?", (now,))
            db.execute("DELETE FROM settled WHERE ts<?", (now - SETTLED_KEEP_S,))

        await self._run(extend)

    async def settle(self, request: SettleRequest) -> bool:
        return await self._run(lambda db: self._settle(db, request, self._clock()))

    def _settle(self, db: sqlite3.Connection, s: SettleRequest, now: float) -> bool:
        a = s.admit
        fresh = db.execute(
            "INSERT OR IGNORE INTO settled VALUES (?, ?)", (a.request_id, now)
        ).rowcount
        if not fresh:
            row = db.execute(
                "SELECT json FROM ledger WHERE request_id=?", (s.record.request_id,)
            ).fetchone()
            lost = None if row is None else LedgerRecord.model_validate_json(row[0])
            return lost is not None and self._supersede(db, s, lost)
        db.execute("DELETE FROM pending WHERE request_id=?", (a.request_id,))
        self._release(
            db,
            a.request_id,
            [cc.key for cc in a.concurrency],
            [(b.key, b.unit, b.expires_at) for b in a.budgets],
            s.used_tokens,
            s.used_usd,
        )
        refund = s.result.reserved_tokens - s.used_tokens
        for rc in a.rates:
            if rc.kind == "tokens" and refund > 0:
                level = self._bucket(db, rc.key, rc.limit, now)
                db.execute(
                    "INSERT OR REPLACE INTO buckets VALUES (?, ?, ?)",
                    (rc.key, min(float(rc.limit), level + refund), now),
                )
        if s.key_id is not None:
            db.execute(
                "INSERT OR REPLACE INTO key_used VALUES (?, ?)", (s.key_id, s.record.ended_at)
            )
        rec = s.record
        db.execute(
            "INSERT OR IGNORE INTO ledger (request_id, tenant, ended_at, json) VALUES (?,?,?,?)",
            (rec.request_id, rec.tenant, rec.ended_at, rec.model_dump_json()),
        )
        if rec.session_id is not None:
            session_seen(db, rec.tenant, rec.session_id, rec.ended_at)
        return True

    def _supersede(self, db: sqlite3.Connection, s: SettleRequest, lost: LedgerRecord) -> bool:
        """The real settlement of a request recorded ``lost`` replaces that record and
        bills the difference (protocol docstring); any other record stays."""
        if lost.status != "lost":
            return False
        billed = lost.prompt_tokens + lost.completion_tokens
        budgets = [(b.key, b.unit, b.expires_at) for b in s.admit.budgets]
        self._release(
            db, s.admit.request_id, [], budgets, s.used_tokens - billed, s.used_usd - lost.cost_usd
        )
        if s.key_id is not None:
            db.execute(
                "INSERT INTO key_used VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET "
                "ts=max(ts, excluded.ts)",
                (s.key_id, s.record.ended_at),
            )
        rec = s.record
        db.execute("DELETE FROM ledger WHERE request_id=?", (lost.request_id,))
        db.execute(
            "INSERT INTO ledger (request_id, tenant, ended_at, json) VALUES (?,?,?,?)",
            (rec.request_id, rec.tenant, rec.ended_at, rec.model_dump_json()),
        )
        return True

    @staticmethod
    def _release(
        db: sqlite3.Connection,
        request_id: str,
        conc: Sequence[str],
        budgets: Sequence[tuple[str, str, float]],
        used_tokens: int,
        used_usd: float,
    ) -> None:
        """Free the request's slots and holds; bill its usage to its budgets."""
        for key in conc:
            db.execute("DELETE FROM slots WHERE key=? AND request_id=?", (key, request_id))
        for key, unit, expires_at in budgets:
            db.execute("DELETE FROM holds WHERE key=? AND request_id=?", (key, request_id))
            amount = float(used_tokens) if unit == "tokens" else used_usd
            db.execute(
                "INSERT INTO budgets VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                "used=used+excluded.used",
                (key, amount, expires_at),
            )

    async def sweep_lost(self, limit: int = 100) -> int:
        return await self._run(lambda db: self._sweep(db, limit, self._clock()))

    def _sweep(self, db: sqlite3.Connection, limit: int, now: float) -> int:
        due = db.execute(
            "SELECT request_id, expires, record, holds FROM pending WHERE expires<=? "
            "ORDER BY expires LIMIT ?",
            (now, max(0, int(limit))),
        ).fetchall()
        wrote = 0
        for request_id, expires, raw, raw_holds in due:
            db.execute("DELETE FROM pending WHERE request_id=?", (request_id,))
            if not db.execute(
                "INSERT OR IGNORE INTO settled VALUES (?, ?)", (request_id, now)
            ).rowcount:
                continue  # settled meanwhile
            rec = lost_record(LedgerRecord.model_validate_json(raw), float(expires))
            holds = json.loads(raw_holds)
            budgets = [(str(k), str(u), float(e)) for k, u, e in holds["budgets"]]
            tokens = rec.prompt_tokens + rec.completion_tokens
            self._release(db, request_id, holds["conc"], budgets, tokens, rec.cost_usd)
            if rec.key_id is not None:
                db.execute(
                    "INSERT INTO key_used VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET "
                    "ts=max(ts, excluded.ts)",
                    (rec.key_id, rec.ended_at),
                )
            wrote += db.execute(
                "INSERT OR IGNORE INTO ledger (request_id, tenant, ended_at, json) "
                "VALUES (?,?,?,?)",
                (rec.request_id, rec.tenant, rec.ended_at, rec.model_dump_json()),
            ).rowcount
        return wrote

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

    async def budget_used(self, key: str) -> tuple[float, float]:
        return await self._run(lambda db: self._held(db, key, self._clock()))
