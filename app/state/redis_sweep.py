"""The lost-request sweep of ``RedisStore`` (the rule is in ``app.state.protocol``):
find each tenant's expired pending entries (``pending_due.lua``), then write their
``lost`` records, bill them and release their holds in one ``sweep.lua`` call per
tenant (one slot each), forgetting tenants with nothing pending."""

from __future__ import annotations

import json
from typing import Any

from app.state.protocol import lost_record
from app.state.records import LedgerRecord

SETTLED_KEEP_S = 2 * 86400  # how long a settled marker is kept (settle and sweep share it)


class RedisSweep:
    """Mixed into ``RedisStore``, which provides the connection, scripts and keys."""

    _redis: Any
    _pending_due: Any
    _sweep: Any

    def _k(self, *parts: str) -> str:
        raise NotImplementedError

    def _tk(self, tenant: str, *parts: str) -> str:
        raise NotImplementedError

    def _pending_keys(self, tenant: str) -> list[str]:
        raise NotImplementedError

    async def _call(self, what: str, awaitable: Any) -> Any:
        raise NotImplementedError

    async def sweep_lost(self, limit: int = 100) -> int:
        if limit <= 0:
            return 0
        listed = self._k("pending", "tenants")
        tenants = sorted(await self._call("sweep lost", self._redis.smembers(listed)))
        if not tenants:
            return 0
        pipe = self._redis.pipeline(transaction=False)  # one script per tenant (slot)
        for t in tenants:
            await self._pending_due(keys=self._pending_keys(t), args=[limit], client=pipe)
        replies = await self._call("sweep lost", pipe.execute())
        empty: list[str] = []
        due: dict[str, list[tuple[str, float, dict[str, Any]]]] = {}
        orphans: list[tuple[str, str]] = []
        left = limit
        for t, (count, *flat) in zip(tenants, replies, strict=True):
            if int(count) == 0:
                empty.append(t)
            for i in range(0, len(flat), 3):
                request_id, expiry, info = flat[i : i + 3]
                if info is None:  # never written so: drop it rather than read it forever
                    orphans.append((t, request_id))
                elif left > 0:
                    due.setdefault(t, []).append((request_id, float(expiry), json.loads(info)))
                    left -= 1
        wrote = 0
        if due or orphans:
            pipe = self._redis.pipeline(transaction=False)
            if due:  # a global key: outside the scripts, before them (as settle does)
                pipe.sadd(self._k("ledger", "tenants"), *due)
            for t, entries in due.items():
                keys, args = self._sweep_call(t, entries)
                await self._sweep(keys=keys, args=args, client=pipe)
            for t, request_id in orphans:
                pipe.zrem(self._tk(t, "pending"), request_id)
            done = await self._call("sweep lost", pipe.execute())
            wrote = sum(int(n) for n in done[1 : 1 + len(due)]) if due else 0
        if empty:  # forget them, then add back any an admit has written to meanwhile
            pipe = self._redis.pipeline(transaction=False)
            pipe.srem(listed, *empty)
            for t in empty:
                pipe.zcard(self._tk(t, "pending"))
            _, *counts = await self._call("sweep lost", pipe.execute())
            back = [t for t, n in zip(empty, counts, strict=True) if int(n) > 0]
            if back:
                await self._call("sweep lost", self._redis.sadd(listed, *back))
        return wrote

    def _sweep_call(
        self, tenant: str, entries: list[tuple[str, float, dict[str, Any]]]
    ) -> tuple[list[str], list[str]]:
        """KEYS and ARGV of the ``sweep`` script for one tenant's expired entries."""
        keys = [
            *self._pending_keys(tenant),
            self._tk(tenant, "ledger", "ids"),
            self._tk(tenant, "ledger"),
            self._tk(tenant, "keys", "last_used"),
            self._tk(tenant, "ledger", "sessions"),
        ]
        plan: list[dict[str, Any]] = []
        records: list[str] = []
        for request_id, expiry, info in entries:
            rec = lost_record(LedgerRecord.model_validate_json(info["record"]), expiry)
            keys.append(self._tk(tenant, "settled", request_id))
            keys += info["conc"]
            for b in info["budgets"]:
                keys += [b["k"], b["k"] + ":held", b["k"] + ":amt"]
            plan.append(
                {
                    "id": request_id,
                    "rid": rec.request_id,
                    "key_id": rec.key_id or "",
                    "ended": rec.ended_at,
                    "tokens": rec.prompt_tokens + rec.completion_tokens,
                    "usd": rec.cost_usd,
                    "conc": len(info["conc"]),
                    "budgets": [{"unit": b["unit"], "exp": b["exp"]} for b in info["budgets"]],
                }
            )
            records.append(rec.model_dump_json())
        return keys, [json.dumps({"keep": SETTLED_KEEP_S, "entries": plan}), *records]
