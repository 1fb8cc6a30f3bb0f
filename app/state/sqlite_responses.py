"""The stored responses of ``SqliteStore`` (the rules are in ``app.state.protocol``).
Table ``responses`` (tenant, response id, expiry, JSON); a read skips expired rows and
each write deletes up to ``SWEEP_ROWS`` expired ones, so the table stays bounded by what
is live."""

from __future__ import annotations

import sqlite3

from app.state.sqlite_parts import SqliteParts

RESPONSE_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (tenant TEXT, id TEXT, expires REAL, json TEXT,
                                      PRIMARY KEY (tenant, id));
CREATE INDEX IF NOT EXISTS responses_expires ON responses (expires);
"""
SWEEP_ROWS = 100


class SqliteResponses(SqliteParts):
    """Mixed into ``SqliteStore``, which provides ``_run``, ``_read`` and the clock."""

    async def put_response(self, tenant: str, response_id: str, data: str, ttl_s: float) -> None:
        now = self._clock()

        def put(db: sqlite3.Connection) -> None:
            db.execute(
                "DELETE FROM responses WHERE rowid IN "
                "(SELECT rowid FROM responses WHERE expires<=? LIMIT ?)",
                (now, SWEEP_ROWS),
            )
            db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)",
                (tenant, response_id, now + ttl_s, data),
            )

        await self._run(put)

    async def get_response(self, tenant: str, response_id: str) -> str | None:
        now = self._clock()

        def get(db: sqlite3.Connection) -> str | None:
            row = db.execute(
                "SELECT json FROM responses WHERE tenant=? AND id=? AND expires>?",
                (tenant, response_id, now),
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._read(get)

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        now = self._clock()

        def delete(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                "DELETE FROM responses WHERE tenant=? AND id=? AND expires>?",
                (tenant, response_id, now),
            )
            return cur.rowcount > 0

        return await self._run(delete)
