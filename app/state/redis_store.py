"""RedisStore: the shared state store for ingress replicas on many nodes.

``admit``, ``settle``, ``refresh``, ``load_principal`` and ``budget_used`` are each ONE
Lua script (EVALSHA) whose clock is Redis ``TIME``, so every replica sharing the
Redis shares buckets, slots and budgets exactly. The rules and their parameters are
in ``app.state.protocol``; this module only maps them onto keys. The scripts are
``app/state/lua/*.lua`` (``prelude.lua``, the shared helpers, is prepended to each).

Key layout (``ns`` = namespace, default ``sy``; ``<check>`` = the check's own key):
- ``ns:key:<id>`` / ``ns:tenant:<id>`` / ``ns:limits:<level>:<tenant>/<name>``: record
  JSON; index sets ``ns:keys``, ``ns:tenants``, ``ns:limits``; hash ``ns:keys:last_used``
  (key id -> epoch seconds of its last settled request).
- ``ns:<rate check>``: hash {tokens, ts}, expires 2 minutes after it would be full.
- ``ns:<concurrency check>``: zset request_id -> expiry; the key expires 60 s after
  its newest member.
- ``ns:<budget check>``: hash {used}; ``...:held``: zset request_id -> expiry of the
  reservation; ``...:amt``: hash request_id -> reserved amount; all three expire at
  ``BudgetCheck.expires_at``.
- ``ns:settled:<request_id>``: idempotency marker of ``settle`` (kept 2 days).
- ``ns:ledger``: stream of settled requests (field ``record`` = LedgerRecord JSON),
  never trimmed here.

The scripts touch keys they compute (records, derived budget keys), so this store
targets a single Redis (or a primary with replicas), not Redis Cluster.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Sequence
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from app.state.protocol import (
    AdmitRequest,
    AdmitResult,
    LedgerQuery,
    RateState,
    SettleRequest,
    StoreUnavailable,
)
from app.state.records import KeyRecord, LedgerRecord, LimitsRecord, Principal, TenantRecord

SETTLED_KEEP_S = 2 * 86400
_PAGE = 500
_INDEX = {"key": "keys", "tenant": "tenants", "limits": "limits"}  # record kind -> index set


def _lua(name: str, *, prelude: bool = True) -> str:
    """A script from ``app/state/lua``, after the shared prelude unless told otherwise."""
    lua = files("app.state") / "lua"
    text = (lua / f"{name}.lua").read_text()
    return (lua / "prelude.lua").read_text() + text if prelude else text


def _redact(url: str) -> str:
    """The URL without its password (safe for logs and error messages)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{k}=***" if k.lower() == "password" else f"{k}={v}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    if netloc == parts.netloc and "=***" not in query:
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


class RedisStore:
    """``url`` is the redacted URL; every error reaching Redis is ``StoreUnavailable``."""

    def __init__(self, url: str, *, namespace: str = "sy", timeout_s: float = 0.5) -> None:
        self.url = _redact(url)
        self._ns = namespace
        # One retry, on connection errors only: a pooled connection that died with a
        # Redis restart is replaced once; timeouts are never retried (the deadline holds).
        self._redis = aioredis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self._admit = self._redis.register_script(_lua("admit"))
        self._settle = self._redis.register_script(_lua("settle"))
        self._refresh = self._redis.register_script(_lua("refresh"))
        self._principal = self._redis.register_script(_lua("principal", prelude=False))
        self._budget_used = self._redis.register_script(_lua("budget_used"))

    def _k(self, *parts: str) -> str:
        return ":".join((self._ns, *parts))

    async def _call(self, what: str, awaitable: Awaitable[Any]) -> Any:
        try:
            return await awaitable
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(
                f"state store {self.url} ({what}): {type(exc).__name__}: {exc}"
            ) from exc

    async def ping(self) -> None:
        await self._call("ping", self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()

    # ---- records -------------------------------------------------------------------

    async def _put(self, kind: str, rid: str, data: str) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self._k(kind, rid), data)
        pipe.sadd(self._k(_INDEX[kind]), rid)
        await self._call(f"put {kind}", pipe.execute())

    async def _all(self, kind: str) -> list[str]:
        ids = await self._call(f"list {kind}", self._redis.smembers(self._k(_INDEX[kind])))
        if not ids:
            return []
        keys = [self._k(kind, i) for i in sorted(ids)]
        return [b for b in await self._call(f"list {kind}", self._redis.mget(keys)) if b]

    async def put_key(self, record: KeyRecord) -> None:
        data = record.model_copy(update={"last_used_at": None}).model_dump_json()
        await self._put("key", record.id, data)

    async def get_key(self, key_id: str) -> KeyRecord | None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(self._k("key", key_id))
        pipe.hget(self._k("keys", "last_used"), key_id)
        raw, last = await self._call("get key", pipe.execute())
        return None if raw is None else self._with_used(KeyRecord.model_validate_json(raw), last)

    @staticmethod
    def _with_used(key: KeyRecord, last: str | None) -> KeyRecord:
        return key if last is None else key.model_copy(update={"last_used_at": float(last)})

    async def list_keys(self, tenant: str | None = None) -> list[KeyRecord]:
        keys = [KeyRecord.model_validate_json(b) for b in await self._all("key")]
        keys = [k for k in keys if tenant is None or k.tenant == tenant]
        if not keys:
            return []
        hmget = self._redis.hmget(self._k("keys", "last_used"), [k.id for k in keys])
        lasts = await self._call("list keys", hmget)
        return [self._with_used(k, last) for k, last in zip(keys, lasts, strict=True)]

    async def put_tenant(self, record: TenantRecord) -> None:
        await self._put("tenant", record.id, record.model_dump_json())

    async def get_tenant(self, tenant: str) -> TenantRecord | None:
        raw = await self._call("get tenant", self._redis.get(self._k("tenant", tenant)))
        return None if raw is None else TenantRecord.model_validate_json(raw)

    async def list_tenants(self) -> list[TenantRecord]:
        return [TenantRecord.model_validate_json(b) for b in await self._all("tenant")]

    async def put_limits(self, record: LimitsRecord) -> None:
        await self._put("limits", record.scope, record.model_dump_json())

    async def list_limits(self) -> list[LimitsRecord]:
        return [LimitsRecord.model_validate_json(b) for b in await self._all("limits")]

    async def load_principal(
        self,
        *,
        key_id: str | None = None,
        tenant: str | None = None,
        team: str | None = None,
        user: str | None = None,
    ) -> Principal:
        args = [self._ns, key_id or "", tenant or "", team or "", user or ""]
        blobs = await self._call("load principal", self._principal(args=args))
        blobs = list(blobs) + [None] * (4 - len(blobs))
        kj, tj, mj, uj = (b or None for b in blobs)
        return Principal(
            key=None if kj is None else KeyRecord.model_validate_json(kj),
            tenant=None if tj is None else TenantRecord.model_validate_json(tj),
            team=None if mj is None else LimitsRecord.model_validate_json(mj),
            user=None if uj is None else LimitsRecord.model_validate_json(uj),
        )

    # ---- admission -----------------------------------------------------------------

    def _checks(self, r: AdmitRequest) -> tuple[dict[str, Any], list[str]]:
        """The checks with namespaced keys, and every key the scripts touch."""
        rates = [{"k": self._k(c.key), "kind": c.kind, "limit": c.limit} for c in r.rates]
        conc = [{"k": self._k(c.key), "limit": c.limit} for c in r.concurrency]
        budgets = [
            {"k": self._k(b.key), "unit": b.unit, "limit": b.limit, "exp": b.expires_at}
            for b in r.budgets
        ]
        keys = [self._k(c.key) for c in r.rates] + [self._k(c.key) for c in r.concurrency]
        keys += [self._k(b.key) + sfx for b in r.budgets for sfx in ("", ":held", ":amt")]
        return {"rates": rates, "conc": conc, "budgets": budgets}, keys

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        r = request
        checks, keys = self._checks(r)
        arg = {
            **checks,
            "id": r.request_id,
            "prompt": r.prompt_tokens,
            "max_out": r.max_output_tokens,
            "min_out": r.min_output_tokens,
            "pin": r.price.input,
            "pout": r.price.output,
            "ttl": r.ttl_s,
        }
        raw = await self._call("admit", self._admit(keys=keys, args=[json.dumps(arg)]))
        out = json.loads(raw)
        rates = tuple(
            RateState(c.kind, c.limit, int(s[0]), float(s[1]))
            for c, s in zip(r.rates, out.get("rates") or [], strict=True)
        )
        if not out["ok"]:
            return AdmitResult(
                False,
                reason=out["reason"],
                scope_key=self._unprefix(out["scope"]),
                retry_after_s=float(out["retry"]),
                rates=rates,
            )
        return AdmitResult(
            True,
            allowance=int(out["allowance"]),
            reserved_tokens=int(out["tokens"]),
            reserved_usd=float(out["usd"]),
            rates=rates,
        )

    def _unprefix(self, key: str) -> str:
        return key[len(self._ns) + 1 :]

    async def refresh(self, admits: Sequence[AdmitRequest], ttl_s: float) -> None:
        items, keys = [], []
        for a in admits:
            checks, touched = self._checks(a)
            keys += touched
            conc = [c["k"] for c in checks["conc"]]
            budgets = [b["k"] for b in checks["budgets"]]
            items.append({"id": a.request_id, "conc": conc, "budgets": budgets})
        if not items:
            return
        arg = json.dumps({"ttl": ttl_s, "items": items})
        await self._call("refresh", self._refresh(keys=keys, args=[arg]))

    async def settle(self, request: SettleRequest) -> bool:
        s = request
        checks, keys = self._checks(s.admit)
        arg = {
            **checks,
            "id": s.admit.request_id,
            "marker": self._k("settled", s.admit.request_id),
            "keep": SETTLED_KEEP_S,
            "reserved": s.result.reserved_tokens,
            "used_tokens": s.used_tokens,
            "used_usd": s.used_usd,
            "key_id": s.key_id or "",
            "last_used": self._k("keys", "last_used"),
            "ended": s.record.ended_at,
            "ledger": self._k("ledger"),
        }
        keys += [arg["marker"], arg["last_used"], arg["ledger"]]
        args = [json.dumps(arg), s.record.model_dump_json()]
        return bool(await self._call("settle", self._settle(keys=keys, args=args)))

    # ---- ledger --------------------------------------------------------------------

    async def query_ledger(self, query: LedgerQuery) -> list[LedgerRecord]:
        """Oldest first; the newest ``limit`` records, newest first, when ``limit`` is set.
        Filters on ``ended_at`` (since inclusive, until exclusive) and tenant."""
        newest_first = query.limit is not None
        out: list[LedgerRecord] = []
        cursor = "+" if newest_first else "-"
        while query.limit is None or len(out) < query.limit:
            if newest_first:
                page = self._redis.xrevrange(self._k("ledger"), cursor, "-", count=_PAGE)
            else:
                page = self._redis.xrange(self._k("ledger"), cursor, "+", count=_PAGE)
            entries = await self._call("query ledger", page)
            for _, fields in entries:
                rec = LedgerRecord.model_validate_json(fields["record"])
                if self._matches(rec, query):
                    out.append(rec)
                    if query.limit is not None and len(out) >= query.limit:
                        break
            if len(entries) < _PAGE:
                break
            cursor = "(" + entries[-1][0]
        return out

    @staticmethod
    def _matches(rec: LedgerRecord, q: LedgerQuery) -> bool:
        return (
            (q.tenant is None or rec.tenant == q.tenant)
            and (q.since is None or rec.ended_at >= q.since)
            and (q.until is None or rec.ended_at < q.until)
        )

    async def budget_used(self, key: str) -> tuple[float, float]:
        k = self._k(key)
        keys = [k, k + ":held", k + ":amt"]
        used, held = await self._call("budget used", self._budget_used(keys=keys))
        return float(used), float(held)
