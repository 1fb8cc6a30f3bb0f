"""Operator actions on tenants, keys, limits and usage — shared by the ``switchyard``
CLI and the ``/admin`` HTTP API, both of which only translate arguments.

A new key's secret is returned once and never stored: the store keeps a keyed hash.
Creating a key for a tenant that does not exist yet creates the tenant (enabled).
Rotating a key keeps its id and limits and replaces its secret; the old secret stops
working at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.adapters.peft import AdapterInvalid
from app.adapters.registry import AdapterRegistry
from app.gateway.keys import new_key
from app.schema import Strict
from app.sessions.book import SessionBook
from app.state.protocol import LedgerQuery, StateStore
from app.state.records import (
    AdapterRecord,
    KeyRecord,
    LedgerRecord,
    Limits,
    LimitsRecord,
    TenantRecord,
)


class AdminError(Exception):
    """A request an operator can fix (bad argument); the message says how (400)."""


class NotFound(AdminError):
    """The tenant or key named does not exist (404)."""


class Conflict(AdminError):
    """What should be created exists already (409)."""


@dataclass(frozen=True)
class IssuedKey:
    record: KeyRecord
    secret: str  # the full key, shown once


class UsageRow(Strict):
    tenant: str
    model: str
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0  # list price
    gpu_seconds: float = 0.0  # engine seconds charged (app.engine.gpu_time)
    gpu_cost_usd: float = 0.0  # ... at the pools' GPU-hour


def summarize(records: Iterable[LedgerRecord]) -> list[UsageRow]:
    """Usage per (tenant, served model), sorted."""
    rows: dict[tuple[str, str], UsageRow] = {}
    for r in records:
        model = r.model_served or r.model_requested
        row = rows.setdefault((r.tenant, model), UsageRow(tenant=r.tenant, model=model))
        row.requests += 1
        row.errors += r.status != "ok"
        row.prompt_tokens += r.prompt_tokens
        row.completion_tokens += r.completion_tokens
        row.cached_tokens += r.cached_tokens
        row.cost_usd += r.cost_usd
        row.gpu_seconds += r.gpu_seconds or 0.0
        row.gpu_cost_usd += r.gpu_cost_usd or 0.0
    return [rows[k] for k in sorted(rows)]


class AdminService:
    def __init__(
        self,
        store: StateStore,
        clock: Callable[[], float] = time.time,
        sessions: SessionBook | None = None,
        adapters: AdapterRegistry | None = None,
    ) -> None:
        self.store = store
        self._clock = clock
        self._sessions = sessions
        self._adapters = adapters

    # ---- LoRA adapters -------------------------------------------------------------------

    def _registry(self) -> AdapterRegistry:
        if self._adapters is None:
            raise NotFound("adapters are registered where the served models are known")
        return self._adapters

    async def add_adapter(
        self,
        name: str,
        base: str,
        source: str,
        tenant: str | None = None,
        price_per_1m_in: float | None = None,
        price_per_1m_out: float | None = None,
    ) -> AdapterRecord:
        registry = self._registry()
        if await self.store.get_adapter(f"{base}:{name}") is not None:
            raise Conflict(f"adapter {base}:{name} exists already (remove it first)")
        try:
            return await registry.add(name, base, source, tenant, price_per_1m_in, price_per_1m_out)
        except AdapterInvalid as exc:
            raise AdminError(str(exc)) from None

    async def list_adapters(self, tenant: str | None = None) -> list[AdapterRecord]:
        found = await self.store.list_adapters()
        return [a for a in found if tenant is None or a.tenant == tenant]

    async def remove_adapter(self, adapter_id: str) -> AdapterRecord:
        record = await self.store.get_adapter(adapter_id)
        if record is None or not await self.store.delete_adapter(adapter_id):
            raise NotFound(f"no adapter {adapter_id!r}")
        return record

    # ---- sessions (any tenant's) ---------------------------------------------------------

    def _book(self) -> SessionBook:
        if self._sessions is None:
            raise NotFound("sessions are served by the gateway only")
        return self._sessions

    async def session(self, tenant: str, session_id: str) -> dict[str, object]:
        found = await self._book().tally(tenant, session_id)
        if found is None:
            raise NotFound(f"no session {session_id!r} of tenant {tenant!r}")
        return found.to_json()

    async def cancel_session(self, tenant: str, session_id: str) -> dict[str, object]:
        if not await self._book().cancel(tenant, session_id):
            raise NotFound(f"no session {session_id!r} of tenant {tenant!r}")
        return await self.session(tenant, session_id)

    # ---- tenants -----------------------------------------------------------------------

    async def create_tenant(self, tenant: str, limits: Limits | None = None) -> TenantRecord:
        if await self.store.get_tenant(tenant) is not None:
            raise Conflict(f"tenant {tenant!r} exists already")
        record = TenantRecord(id=tenant, limits=limits or Limits(), created_at=self._clock())
        await self.store.put_tenant(record)
        return record

    async def update_tenant(
        self, tenant: str, *, disabled: bool | None = None, limits: Limits | None = None
    ) -> TenantRecord:
        record = await self.store.get_tenant(tenant)
        if record is None:
            raise NotFound(f"no tenant {tenant!r}")
        changes: dict[str, object] = {}
        if disabled is not None:
            changes["disabled"] = disabled
        if limits is not None:
            changes["limits"] = limits
        record = record.model_copy(update=changes)
        await self.store.put_tenant(record)
        return record

    async def list_tenants(self) -> list[TenantRecord]:
        return await self.store.list_tenants()

    # ---- keys ----------------------------------------------------------------------------

    async def create_key(
        self,
        tenant: str,
        *,
        team: str | None = None,
        user: str | None = None,
        name: str | None = None,
        limits: Limits | None = None,
        expires_at: float | None = None,
    ) -> IssuedKey:
        if expires_at is not None and expires_at <= self._clock():
            raise AdminError("expires_at is in the past; a key must expire in the future")
        if await self.store.get_tenant(tenant) is None:
            await self.store.put_tenant(TenantRecord(id=tenant, created_at=self._clock()))
        fresh = new_key()
        record = KeyRecord(
            id=fresh.key_id,
            prefix=fresh.prefix,
            salt=fresh.salt_hex,
            digest=fresh.digest_hex,
            tenant=tenant,
            team=team,
            user=user,
            name=name,
            limits=limits or Limits(),
            created_at=self._clock(),
            expires_at=expires_at,
        )
        await self.store.put_key(record)
        return IssuedKey(record, fresh.secret_key)

    async def _key(self, key_id: str) -> KeyRecord:
        record = await self.store.get_key(key_id)
        if record is None:
            raise NotFound(f"no key {key_id!r}")
        return record

    async def list_keys(self, tenant: str | None = None) -> list[KeyRecord]:
        return await self.store.list_keys(tenant)

    async def revoke_key(self, key_id: str) -> KeyRecord:
        record = await self._key(key_id)
        if record.revoked_at is None:
            record = record.model_copy(update={"revoked_at": self._clock()})
            await self.store.put_key(record)
        return record

    async def rotate_key(self, key_id: str) -> IssuedKey:
        record = await self._key(key_id)
        if record.revoked_at is not None:
            raise AdminError(f"key {key_id!r} is revoked; create a new one")
        fresh = new_key(key_id=key_id)
        record = record.model_copy(update={"salt": fresh.salt_hex, "digest": fresh.digest_hex})
        await self.store.put_key(record)
        return IssuedKey(record, fresh.secret_key)

    # ---- team and user limits ------------------------------------------------------------

    async def set_limits(self, level: str, tenant: str, name: str, limits: Limits) -> LimitsRecord:
        if level not in ("team", "user"):
            raise AdminError("level must be 'team' or 'user'")
        record = LimitsRecord(level=level, tenant=tenant, name=name, limits=limits)  # type: ignore[arg-type]
        await self.store.put_limits(record)
        return record

    async def list_limits(self) -> list[LimitsRecord]:
        return await self.store.list_limits()

    # ---- usage ---------------------------------------------------------------------------

    async def usage_records(self, query: LedgerQuery) -> list[LedgerRecord]:
        return await self.store.query_ledger(query)

    async def usage(self, query: LedgerQuery) -> list[UsageRow]:
        return summarize(await self.store.query_ledger(query))
