"""Admission and settlement in ``SqliteStore`` (the rules and their parameters are in
``app.state.protocol``): ``admit`` and ``settle`` each one ``BEGIN IMMEDIATE``
transaction over the tables ``buckets`` (token buckets), ``slots`` (concurrency
reservations), ``budgets`` (used per budget counter) and ``holds`` (budget
reservations), ``settled`` (idempotency markers), ``ledger`` and ``pending`` (the record
to write if a tracked request is lost: its expiry follows the reservation's; ``holds`` =
JSON ``{"conc": [check key], "budgets": [[check key, unit, expires_at]]}``, what
``sweep_lost`` releases and bills)."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from app.state.protocol import AdmitRequest, AdmitResult, RateState, SettleRequest, lost_record
from app.state.records import LedgerRecord
from app.state.sqlite_parts import SqliteParts
from app.state.sqlite_sessions import session_seen

SETTLED_KEEP_S = 2 * 86400.0


class SqliteAdmission(SqliteParts):
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

    async def budget_used(self, key: str) -> tuple[float, float]:
        return await self._run(lambda db: self._held(db, key, self._clock()))
