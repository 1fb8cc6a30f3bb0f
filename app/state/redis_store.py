"""RedisStore: the shared state store for ingress replicas on many nodes.

``admit``, ``settle``, ``refresh`` and ``budget_used`` are Lua scripts (EVALSHA) whose
clock is Redis ``TIME``, so every replica sharing the Redis shares buckets, slots and
budgets exactly. The rules and their parameters are in ``app.state.protocol``; this
module only maps them onto keys. The scripts are ``app/state/lua/*.lua`` (``prelude.lua``,
the shared helpers, is prepended to each); every key a script touches is passed in
``KEYS``, none is computed inside a script.

Key names, hash tags, the key layout and what Redis Cluster support means are in
``app.state.redis_keys``.
"""


from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Iterable, Sequence
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
    RateState,
    SettleRequest,
    StoreUnavailable,
)
from app.state.records import AdapterRecord, KeyRecord, LimitsRecord, Principal, TenantRecord
from app.state.redis_keys import check_owner, scope_tenant, tag
from app.state.redis_ledger import RedisLedger
from app.state.redis_responses import RedisResponses
from app.state.redis_sessions import RedisSessions
from app.state.redis_sweep import SETTLED_KEEP_S, RedisSweep

KEY_CACHE_MAX = 100_000  # key id -> (tenant, team, user) entries remembered
# record kind -> index set
_INDEX = {"key": "keys", "tenant": "tenants", "limits": "limits", "adapter": "adapters"}
KeyScope = tuple[str, str | None, str | None]  # a key's tenant, team, user


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


class RedisStore(RedisSweep, RedisLedger, RedisSessions, RedisResponses):
    """``url`` is the redacted URL; every error reaching Redis is ``StoreUnavailable``."""

    def __init__(self, url: str, *, namespace: str = "sy", timeout_s: float = 0.5) -> None:
        if "{" in namespace or "}" in namespace:
            raise ValueError(f"namespace {namespace!r}: braces would break the hash tags")
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
        self._budget_used = self._redis.register_script(_lua("budget_used"))
        self._pending_due = self._redis.register_script(_lua("pending_due"))
        self._sweep = self._redis.register_script(_lua("sweep"))
        self._close_sessions = self._redis.register_script(_lua("close_sessions", prelude=False))
        self._key_scopes: dict[str, KeyScope] = {}  # learned from key records

    def _k(self, *parts: str) -> str:
        return ":".join((self._ns, *parts))

    def _tk(self, tenant: str, *parts: str) -> str:
        """A key in the tenant's slot."""
        return self._k(tag(tenant), *parts)

    async def _call(self, what: str, awaitable: Awaitable[Any]) -> Any:
        try:
            return await awaitable
        except (RedisError, OSError, TimeoutError) as exc:
            lost = isinstance(exc, RedisConnectionError | OSError)
            if lost and not isinstance(exc, TimeoutError):  # a slow server keeps its pool
                # The server went away: every idle pooled connection is dead too. Drop
                # them now, so that once it is back no call spends its deadline (or
                # its one retry) finding that out connection by connection.
                with contextlib.suppress(Exception):
                    await self._redis.connection_pool.disconnect(inuse_connections=False)
            raise StoreUnavailable(
                f"state store {self.url} ({what}): {type(exc).__name__}: {exc}"
            ) from exc

    async def ping(self) -> None:
        await self._call("ping", self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()

    # ---- records -------------------------------------------------------------------

    def _record_key(self, kind: str, rid: str) -> str:
        if kind == "tenant":
            return self._tk(rid, "tenant")
        if kind == "limits":
            tenant = scope_tenant(rid)
            return self._k(tag(rid) if tenant is None else tag(tenant), "limits", rid)
        return self._k(kind, rid)

    async def _put(self, kind: str, rid: str, data: str) -> None:
        pipe = self._redis.pipeline(transaction=False)  # the record and its index: two slots
        pipe.set(self._record_key(kind, rid), data)
        pipe.sadd(self._k(_INDEX[kind]), rid)
        await self._call(f"put {kind}", pipe.execute())

    async def _all(self, kind: str) -> list[str]:
        ids = await self._call(f"list {kind}", self._redis.smembers(self._k(_INDEX[kind])))
        if not ids:
            return []
        pipe = self._redis.pipeline(transaction=False)  # GETs, not one MGET: many slots
        for i in sorted(ids):
            pipe.get(self._record_key(kind, i))
        return [b for b in await self._call(f"list {kind}", pipe.execute()) if b]

    def _learn(self, key: KeyRecord) -> None:
        self._key_scopes.pop(key.id, None)
        if len(self._key_scopes) >= KEY_CACHE_MAX:
            self._key_scopes.pop(next(iter(self._key_scopes)))
        self._key_scopes[key.id] = (key.tenant, key.team, key.user)

    async def put_key(self, record: KeyRecord) -> None:
        data = record.model_copy(update={"last_used_at": None}).model_dump_json()
        await self._put("key", record.id, data)
        self._learn(record)

    async def get_key(self, key_id: str) -> KeyRecord | None:
        raw = await self._call("get key", self._redis.get(self._k("key", key_id)))
        if raw is None:
            return None
        key = KeyRecord.model_validate_json(raw)
        self._learn(key)
        last = self._redis.hget(self._tk(key.tenant, "keys", "last_used"), key_id)
        return self._with_used(key, await self._call("get key", last))

    @staticmethod
    def _with_used(key: KeyRecord, last: str | None) -> KeyRecord:
        return key if last is None else key.model_copy(update={"last_used_at": float(last)})

    async def list_keys(self, tenant: str | None = None) -> list[KeyRecord]:
        keys = [KeyRecord.model_validate_json(b) for b in await self._all("key")]
        keys = [k for k in keys if tenant is None or k.tenant == tenant]
        if not keys:
            return []
        by_tenant: dict[str, list[KeyRecord]] = {}
        for k in keys:
            self._learn(k)
            by_tenant.setdefault(k.tenant, []).append(k)
        pipe = self._redis.pipeline(transaction=False)
        for t, ks in by_tenant.items():
            pipe.hmget(self._tk(t, "keys", "last_used"), [k.id for k in ks])
        lasts = await self._call("list keys", pipe.execute())
        used = {
            k.id: self._with_used(k, last)
            for ks, got in zip(by_tenant.values(), lasts, strict=True)
            for k, last in zip(ks, got, strict=True)
        }
        return [used[k.id] for k in keys]

    async def put_tenant(self, record: TenantRecord) -> None:
        await self._put("tenant", record.id, record.model_dump_json())

    async def get_tenant(self, tenant: str) -> TenantRecord | None:
        raw = await self._call("get tenant", self._redis.get(self._record_key("tenant", tenant)))
        return None if raw is None else TenantRecord.model_validate_json(raw)

    async def list_tenants(self) -> list[TenantRecord]:
        return [TenantRecord.model_validate_json(b) for b in await self._all("tenant")]

    async def put_adapter(self, record: AdapterRecord) -> None:
        await self._put("adapter", record.id, record.model_dump_json())

    async def get_adapter(self, adapter_id: str) -> AdapterRecord | None:
        key = self._record_key("adapter", adapter_id)
        raw = await self._call("get adapter", self._redis.get(key))
        return None if raw is None else AdapterRecord.model_validate_json(raw)

    async def list_adapters(self) -> list[AdapterRecord]:
        return [AdapterRecord.model_validate_json(b) for b in await self._all("adapter")]

    async def delete_adapter(self, adapter_id: str) -> bool:
        pipe = self._redis.pipeline(transaction=False)  # the record and its index: two slots
        pipe.delete(self._record_key("adapter", adapter_id))
        pipe.srem(self._k(_INDEX["adapter"]), adapter_id)
        deleted, _ = await self._call("delete adapter", pipe.execute())
        return bool(deleted)

    async def put_limits(self, record: LimitsRecord) -> None:
        await self._put("limits", record.scope, record.model_dump_json())

    async def list_limits(self) -> list[LimitsRecord]:
        return [LimitsRecord.model_validate_json(b) for b in await self._all("limits")]

    def _principal_records(
        self, pipe: Any, tenant: str, team: str | None, user: str | None
    ) -> list[bool]:
        """Queue one MGET (one slot) of the tenant record and the team/user limits that
        are named; returns which of (tenant, team, user) it reads."""
        wanted = [True, bool(team), bool(user)]
        names = [self._record_key("tenant", tenant)]
        names += [self._record_key("limits", f"team:{tenant}/{team}")] if team else []
        names += [self._record_key("limits", f"user:{tenant}/{user}")] if user else []
        pipe.mget(names)
        return wanted

    @staticmethod
    def _principal(key: KeyRecord | None, wanted: list[bool], blobs: list[str | None]) -> Principal:
        got = iter(blobs)
        tj, mj, uj = (next(got) if w else None for w in wanted)
        return Principal(
            key=key,
            tenant=None if tj is None else TenantRecord.model_validate_json(tj),
            team=None if mj is None else LimitsRecord.model_validate_json(mj),
            user=None if uj is None else LimitsRecord.model_validate_json(uj),
        )

    async def load_principal(
        self,
        *,
        key_id: str | None = None,
        tenant: str | None = None,
        team: str | None = None,
        user: str | None = None,
    ) -> Principal:
        key = None
        if key_id is not None:
            guess = self._key_scopes.get(key_id)
            pipe = self._redis.pipeline(transaction=False)
            pipe.get(self._k("key", key_id))
            wanted = self._principal_records(pipe, *guess) if guess and guess[0] else None
            raw, *blobs = await self._call("load principal", pipe.execute())
            if raw is None:
                return Principal()
            key = KeyRecord.model_validate_json(raw)
            self._learn(key)
            tenant, team, user = key.tenant, key.team, key.user
            if wanted is not None and guess == (tenant, team, user):
                return self._principal(key, wanted, blobs[0])
        if not tenant:
            return Principal(key=key)
        pipe = self._redis.pipeline(transaction=False)
        wanted = self._principal_records(pipe, tenant, team, user)
        (blobs,) = await self._call("load principal", pipe.execute())
        return self._principal(key, wanted, blobs)

    # ---- admission -----------------------------------------------------------------

    async def _tags(self, check_keys: Iterable[str]) -> dict[str, str]:
        """The hash tag of each check key (module docstring); reads the key records not
        known yet (one round trip)."""
        owners = {c: check_owner(c) for c in check_keys}
        missing = sorted(
            {o for kind, o in owners.values() if kind == "key" and o not in self._key_scopes}
        )
        if missing:
            pipe = self._redis.pipeline(transaction=False)
            for kid in missing:
                pipe.get(self._k("key", kid))
            for raw in await self._call("key tenants", pipe.execute()):
                if raw is not None:
                    self._learn(KeyRecord.model_validate_json(raw))
        out = {}
        for check, (kind, owner) in owners.items():
            if kind == "key":
                known = self._key_scopes.get(owner)
                out[check] = tag(known[0]) if known else tag("key:" + owner)
            else:
                out[check] = tag(owner)
        return out

    @staticmethod
    def _check_keys(r: AdmitRequest) -> list[str]:
        return (
            [c.key for c in r.rates] + [c.key for c in r.concurrency] + [b.key for b in r.budgets]
        )

    def _layout(
        self, r: AdmitRequest, tags: dict[str, str]
    ) -> tuple[dict[str, Any], list[str], list[str]]:
        """The checks' parameters, their keys in the order of prelude ``checks``, and the
        check key behind each of those keys."""
        rates = [{"kind": c.kind, "limit": c.limit} for c in r.rates]
        conc = [{"limit": c.limit} for c in r.concurrency]
        budgets = [{"unit": b.unit, "limit": b.limit, "exp": b.expires_at} for b in r.budgets]
        keys, scopes = [], []
        for check in [c.key for c in r.rates] + [c.key for c in r.concurrency]:
            keys.append(self._k(tags[check], check))
            scopes.append(check)
        for b in r.budgets:
            base = self._k(tags[b.key], b.key)
            keys += [base, base + ":held", base + ":amt"]
            scopes += [b.key] * 3
        return {"rates": rates, "conc": conc, "budgets": budgets}, keys, scopes

    def _pending_keys(self, tenant: str) -> list[str]:
        """The tenant's pending zset and pending hash."""
        return [self._tk(tenant, "pending"), self._tk(tenant, "pending", "info")]

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        r = request
        tags = await self._tags(self._check_keys(r))
        checks, keys, scopes = self._layout(r, tags)
        arg = {
            **checks,
            "id": r.request_id,
            "prompt": r.prompt_tokens,
            "max_out": r.max_output_tokens,
            "min_out": r.min_output_tokens,
            "pin": r.price.input,
            "pout": r.price.output,
            "ttl": r.ttl_s,
            "pending": r.tracked,
        }
        if r.tracked:
            assert r.pending is not None
            info = {
                "record": r.pending.model_dump_json(),
                "conc": [self._k(tags[c.key], c.key) for c in r.concurrency],
                "budgets": [
                    {"k": self._k(tags[b.key], b.key), "unit": b.unit, "exp": b.expires_at}
                    for b in r.budgets
                ],
            }
            t = r.pending.tenant
            pipe = self._redis.pipeline(transaction=False)
            await self._admit(
                keys=keys + self._pending_keys(t),
                args=[json.dumps(arg), json.dumps(info)],
                client=pipe,
            )
            pipe.sadd(self._k("pending", "tenants"), t)  # a global key: after the script
            raw, _ = await self._call("admit", pipe.execute())
        else:
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
                scope_key=scopes[int(out["scope"]) - 1],
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

    async def refresh(self, admits: Sequence[AdmitRequest], ttl_s: float) -> None:
        tags = await self._tags(
            [c.key for a in admits for c in a.concurrency]
            + [b.key for a in admits for b in a.budgets]
        )
        groups: dict[str, tuple[list[str], list[str]]] = {}  # tag -> (KEYS, ARGV after ttl)
        for a in admits:
            held = [(tags[c.key], c.key, "1") for c in a.concurrency]
            held += [(tags[b.key], b.key + ":held", "0") for b in a.budgets]
            if a.tracked:
                assert a.pending is not None
                held.append((tag(a.pending.tenant), "pending", "0"))
            for tg, name, is_conc in held:
                keys, args = groups.setdefault(tg, ([], []))
                keys.append(self._k(tg, name))
                args += [a.request_id, is_conc]
        if not groups:
            return
        pipe = self._redis.pipeline(transaction=False)  # one script per tenant (slot)
        for keys, args in groups.values():
            await self._refresh(keys=keys, args=[repr(float(ttl_s)), *args], client=pipe)
        await self._call("refresh", pipe.execute())

    async def settle(self, request: SettleRequest) -> bool:
        s = request
        checks, keys, _ = self._layout(s.admit, await self._tags(self._check_keys(s.admit)))
        t = s.record.tenant
        fixed = [
            self._tk(t, "settled", s.admit.request_id),
            self._tk(t, "ledger", "ids"),
            self._tk(t, "ledger"),
            self._tk(t, "keys", "last_used"),
            *self._pending_keys(t),
            self._tk(t, "ledger", "sessions"),
        ]
        arg = {
            **checks,
            "id": s.admit.request_id,
            "rid": s.record.request_id,
            "keep": SETTLED_KEEP_S,
            "reserved": s.result.reserved_tokens,
            "used_tokens": s.used_tokens,
            "used_usd": s.used_usd,
            "key_id": s.key_id or "",
            "ended": s.record.ended_at,
        }
        pipe = self._redis.pipeline(transaction=False)
        pipe.sadd(self._k("ledger", "tenants"), t)  # a global key: outside the script
        if s.record.session_id is not None:  # the session was active until now
            self._session_seen(pipe, t, s.record.session_id, s.record.ended_at)
        args = [json.dumps(arg), s.record.model_dump_json()]
        await self._settle(keys=fixed + keys, args=args, client=pipe)
        *_, done = await self._call("settle", pipe.execute())
        return bool(done)

    async def budget_used(self, key: str) -> tuple[float, float]:
        k = self._k((await self._tags([key]))[key], key)
        keys = [k, k + ":held", k + ":amt"]
        used, held = await self._call("budget used", self._budget_used(keys=keys))
        return float(used), float(held)
