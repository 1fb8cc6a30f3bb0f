"""The session reads and writes of ``SqliteStore`` (the rules are in
``app.state.protocol``). Tables: ``sessions`` (tenant, session id, last activity, open
flag, end of the cancellation) and ``session_cancels`` (the cancel feed: the cursor is
its autoincrement ``seq``, so a reader never misses an entry); a session's ledger records
are found through the ``ledger_session`` index on the record's ``session_id``."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any, TypeVar

from app.state.protocol import SessionKey, SessionState
from app.state.sqlite_parts import SqliteParts

T = TypeVar("T")

SESSION_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (tenant TEXT, session_id TEXT, last_at REAL,
                                     open INTEGER, cancelled_until REAL,
                                     PRIMARY KEY (tenant, session_id));
CREATE INDEX IF NOT EXISTS sessions_open ON sessions (open, last_at);
CREATE TABLE IF NOT EXISTS session_cancels (seq INTEGER PRIMARY KEY AUTOINCREMENT,
                                            tenant TEXT, session_id TEXT);
CREATE INDEX IF NOT EXISTS ledger_session ON ledger (tenant, json_extract(json, '$.session_id'));
"""
FEED_KEEP = 10_000  # cancel-feed rows kept
POLL_S = 0.25  # how often a waiting ``session_cancels`` looks again (a read, no lock)


def session_seen(db: sqlite3.Connection, tenant: str, session_id: str, at: float) -> None:
    """The session was active at ``at``: open it, raise its last activity."""
    db.execute(
        "INSERT INTO sessions VALUES (?, ?, ?, 1, NULL) ON CONFLICT(tenant, session_id) "
        "DO UPDATE SET last_at=max(last_at, excluded.last_at), open=1",
        (tenant, session_id, at),
    )


class SqliteSessions(SqliteParts):
    """Mixed into ``SqliteStore``, which provides ``_run`` and the clock."""

    async def session_call(self, tenant: str, session_id: str, at: float) -> float | None:
        def call(db: sqlite3.Connection) -> float | None:
            row = db.execute(
                "SELECT cancelled_until FROM sessions WHERE tenant=? AND session_id=?",
                (tenant, session_id),
            ).fetchone()
            session_seen(db, tenant, session_id, at)
            until = row[0] if row is not None else None
            return float(until) if until is not None and until > self._clock() else None

        return await self._run(call)

    async def session_state(self, tenant: str, session_id: str) -> SessionState:
        return await self._run(lambda db: self._state(db, tenant, session_id))

    def _state(self, db: sqlite3.Connection, tenant: str, session_id: str) -> SessionState:
        row = db.execute(
            "SELECT last_at, open, cancelled_until FROM sessions WHERE tenant=? AND session_id=?",
            (tenant, session_id),
        ).fetchone()
        recorded = db.execute(
            "SELECT 1 FROM ledger WHERE tenant=? AND json_extract(json, '$.session_id')=? LIMIT 1",
            (tenant, session_id),
        ).fetchone()
        if row is None:
            return SessionState(known=recorded is not None)
        last_at, is_open, until = row
        live = until is not None and until > self._clock()
        return SessionState(
            known=True,
            open=bool(is_open),
            last_at=last_at,
            cancelled_until=float(until) if live else None,
        )

    async def cancel_session(self, tenant: str, session_id: str, until: float) -> bool:
        def cancel(db: sqlite3.Connection) -> bool:
            if not self._state(db, tenant, session_id).known:
                return False
            db.execute(
                "INSERT INTO sessions VALUES (?, ?, ?, 0, ?) ON CONFLICT(tenant, session_id) "
                "DO UPDATE SET cancelled_until=excluded.cancelled_until",
                (tenant, session_id, self._clock(), until),
            )
            seq = db.execute(
                "INSERT INTO session_cancels (tenant, session_id) VALUES (?, ?)",
                (tenant, session_id),
            ).lastrowid
            db.execute("DELETE FROM session_cancels WHERE seq<=?", ((seq or 0) - FEED_KEEP,))
            return True

        return await self._run(cancel)

    async def session_cancels(
        self, cursor: str | None, wait_s: float
    ) -> tuple[list[SessionKey], str]:
        def read(db: sqlite3.Connection) -> list[Any]:
            after = int(cursor) if cursor is not None else -1
            if after < 0:
                return db.execute("SELECT max(seq), NULL, NULL FROM session_cancels").fetchall()
            return db.execute(
                "SELECT seq, tenant, session_id FROM session_cancels WHERE seq>? "
                "ORDER BY seq LIMIT 100",
                (after,),
            ).fetchall()

        deadline = time.monotonic() + wait_s
        while True:
            rows = await self._read(read)  # a poll: no write lock
            if cursor is None:
                return [], str(rows[0][0] or 0)
            if rows or time.monotonic() >= deadline:
                found = [SessionKey(t, s) for _, t, s in rows]
                return found, str(rows[-1][0]) if rows else cursor
            await asyncio.sleep(POLL_S)

    async def close_idle_sessions(self, before: float, limit: int = 100) -> list[SessionKey]:
        def close(db: sqlite3.Connection) -> list[SessionKey]:
            rows = db.execute(
                "SELECT tenant, session_id FROM sessions WHERE open=1 AND last_at<? "
                "ORDER BY last_at LIMIT ?",
                (before, max(0, int(limit))),
            ).fetchall()
            for t, sid in rows:
                db.execute("UPDATE sessions SET open=0 WHERE tenant=? AND session_id=?", (t, sid))
            return [SessionKey(t, sid) for t, sid in rows]

        return await self._run(close)
