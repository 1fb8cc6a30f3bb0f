"""The records of ``SqliteStore``: keys, adapters, tenants and team/user limits, each a
JSON row of the ``records`` table under its kind (one put/get/list written once,
``_put_record``/``_get_record``/``_list_records``), a key's last use in ``key_used``,
and the principal a request is checked against (``load_principal``)."""

from __future__ import annotations

import sqlite3
from typing import TypeVar

from pydantic import BaseModel

from app.state.records import AdapterRecord, KeyRecord, LimitsRecord, Principal, TenantRecord
from app.state.sqlite_parts import SqliteParts

R = TypeVar("R", bound=BaseModel)


def _get(db: sqlite3.Connection, kind: str, rid: str, model: type[R]) -> R | None:
    row = db.execute("SELECT json FROM records WHERE kind=? AND id=?", (kind, rid)).fetchone()
    return None if row is None else model.model_validate_json(row[0])


def _all(db: sqlite3.Connection, kind: str, model: type[R]) -> list[R]:
    rows = db.execute("SELECT json FROM records WHERE kind=? ORDER BY id", (kind,))
    return [model.model_validate_json(r[0]) for r in rows]


def _with_used(db: sqlite3.Connection, key: KeyRecord) -> KeyRecord:
    row = db.execute("SELECT ts FROM key_used WHERE id=?", (key.id,)).fetchone()
    return key if row is None else key.model_copy(update={"last_used_at": float(row[0])})


class SqliteRecords(SqliteParts):
    async def _put_record(self, kind: str, rid: str, record: BaseModel) -> None:
        data = record.model_dump_json()
        await self._run(
            lambda db: db.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?)",
                                  (kind, rid, data))
        )  # fmt: skip

    async def _get_record(self, kind: str, rid: str, model: type[R]) -> R | None:
        return await self._run(lambda db: _get(db, kind, rid, model))

    async def _list_records(self, kind: str, model: type[R]) -> list[R]:
        return await self._run(lambda db: _all(db, kind, model))

    async def put_key(self, record: KeyRecord) -> None:
        # its last use lives in key_used (written by settlements), not in the record
        await self._put_record("key", record.id, record.model_copy(update={"last_used_at": None}))

    async def get_key(self, key_id: str) -> KeyRecord | None:
        def get(db: sqlite3.Connection) -> KeyRecord | None:
            key = _get(db, "key", key_id, KeyRecord)
            return None if key is None else _with_used(db, key)

        return await self._run(get)

    async def list_keys(self, tenant: str | None = None) -> list[KeyRecord]:
        def get(db: sqlite3.Connection) -> list[KeyRecord]:
            keys = _all(db, "key", KeyRecord)
            return [_with_used(db, k) for k in keys if tenant is None or k.tenant == tenant]

        return await self._run(get)

    async def put_adapter(self, record: AdapterRecord) -> None:
        await self._put_record("adapter", record.id, record)

    async def get_adapter(self, adapter_id: str) -> AdapterRecord | None:
        return await self._get_record("adapter", adapter_id, AdapterRecord)

    async def list_adapters(self) -> list[AdapterRecord]:
        return await self._list_records("adapter", AdapterRecord)

    async def delete_adapter(self, adapter_id: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            cur = db.execute("DELETE FROM records WHERE kind='adapter' AND id=?", (adapter_id,))
            return cur.rowcount > 0

        return await self._run(delete)

    async def put_tenant(self, record: TenantRecord) -> None:
        await self._put_record("tenant", record.id, record)

    async def get_tenant(self, tenant: str) -> TenantRecord | None:
        return await self._get_record("tenant", tenant, TenantRecord)

    async def list_tenants(self) -> list[TenantRecord]:
        return await self._list_records("tenant", TenantRecord)

    async def put_limits(self, record: LimitsRecord) -> None:
        await self._put_record("limits", record.scope, record)

    async def list_limits(self) -> list[LimitsRecord]:
        return await self._list_records("limits", LimitsRecord)

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
                key = _get(db, "key", key_id, KeyRecord)
                if key is None:
                    return Principal()
                t, m, u = key.tenant, key.team, key.user
            if t is None:
                return Principal(key=key)
            return Principal(
                key=key,
                tenant=_get(db, "tenant", t, TenantRecord),
                team=_get(db, "limits", f"team:{t}/{m}", LimitsRecord) if m else None,
                user=_get(db, "limits", f"user:{t}/{u}", LimitsRecord) if u else None,
            )

        return await self._run(load)
