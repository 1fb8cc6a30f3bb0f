"""The session reads and writes of ``RedisStore`` (the rules are in
``app.state.protocol``). Keys (``ns`` = namespace, ``{T}`` = the tenant's hash tag):

- ``ns:{T}:sessions:open``: zset session id -> epoch seconds of its last activity, for
  open sessions; ``session_call`` and ``settle`` raise the score (ZADD GT: Redis >= 6.2),
  ``close_idle_sessions`` takes the idle ones out in one script per tenant
  (``close_sessions.lua``), so each is claimed once.
- ``ns:{T}:sessions:seen``: zset session id -> last activity, never trimmed by closing
  (what makes a closed session still known).
- ``ns:{T}:session:cancelled:<id>``: the end of the cancellation (epoch seconds), expiring
  then.
- ``ns:{T}:ledger:sessions``: hash session id -> its ledger entry ids (written by the
  settle and sweep scripts).
- ``ns:sessions:tenants``: set of tenants with sessions (global); ``ns:sessions:cancels``:
  the cancel feed, a stream of (tenant, session), trimmed to about ``FEED_KEEP`` entries.
"""

from __future__ import annotations

import math
import time
from typing import Any

from app.state.protocol import SessionKey, SessionState

FEED_KEEP = 10_000  # cancel-feed entries kept (a replica more than this behind skips)


class RedisSessions:
    """Mixed into ``RedisStore``, which provides the connection and key helpers."""

    _redis: Any
    _close_sessions: Any

    def _k(self, *parts: str) -> str:
        raise NotImplementedError

    def _tk(self, tenant: str, *parts: str) -> str:
        raise NotImplementedError

    async def _call(self, what: str, awaitable: Any) -> Any:
        raise NotImplementedError

    def _session_seen(self, pipe: Any, tenant: str, session_id: str, at: float) -> None:
        """Queue on ``pipe``: the session was active at ``at`` (scores only rise)."""
        pipe.zadd(self._tk(tenant, "sessions", "open"), {session_id: at}, gt=True)
        pipe.zadd(self._tk(tenant, "sessions", "seen"), {session_id: at}, gt=True)
        pipe.sadd(self._k("sessions", "tenants"), tenant)

    async def session_call(self, tenant: str, session_id: str, at: float) -> float | None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(self._tk(tenant, "session", "cancelled", session_id))
        self._session_seen(pipe, tenant, session_id, at)
        cancelled, *_ = await self._call("session call", pipe.execute())
        return float(cancelled) if cancelled is not None else None

    async def session_state(self, tenant: str, session_id: str) -> SessionState:
        pipe = self._redis.pipeline(transaction=False)
        pipe.zscore(self._tk(tenant, "sessions", "open"), session_id)
        pipe.zscore(self._tk(tenant, "sessions", "seen"), session_id)
        pipe.hexists(self._tk(tenant, "ledger", "sessions"), session_id)
        pipe.get(self._tk(tenant, "session", "cancelled", session_id))
        opened, seen, recorded, cancelled = await self._call("session state", pipe.execute())
        until = float(cancelled) if cancelled is not None else None
        return SessionState(
            known=seen is not None or bool(recorded) or until is not None,
            open=opened is not None,
            last_at=float(seen) if seen is not None else None,
            cancelled_until=until,
        )

    async def cancel_session(self, tenant: str, session_id: str, until: float) -> bool:
        if not (await self.session_state(tenant, session_id)).known:
            return False
        ttl = max(1, math.ceil(until - time.time()))
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._tk(tenant, "session", "cancelled", session_id), repr(until), ex=ttl)
        pipe.xadd(
            self._k("sessions", "cancels"),
            {"tenant": tenant, "session": session_id},
            maxlen=FEED_KEEP,
            approximate=True,
        )
        await self._call("cancel session", pipe.execute())
        return True

    async def session_cancels(
        self, cursor: str | None, wait_s: float
    ) -> tuple[list[SessionKey], str]:
        feed = self._k("sessions", "cancels")
        if cursor is None:
            last = await self._call("session cancels", self._redis.xrevrange(feed, count=1))
            return [], last[0][0] if last else "0-0"
        block = max(1, int(wait_s * 1000))
        reply = await self._call(
            "session cancels", self._redis.xread({feed: cursor}, count=100, block=block)
        )
        found: list[SessionKey] = []
        for _, entries in reply or ():
            for entry_id, fields in entries:
                found.append(SessionKey(fields["tenant"], fields["session"]))
                cursor = entry_id
        return found, cursor

    async def close_idle_sessions(self, before: float, limit: int = 100) -> list[SessionKey]:
        tenants = sorted(
            await self._call("close sessions", self._redis.smembers(self._k("sessions", "tenants")))
        )
        if not tenants or limit <= 0:
            return []
        pipe = self._redis.pipeline(transaction=False)  # one script per tenant (slot)
        for t in tenants:
            key = self._tk(t, "sessions", "open")
            await self._close_sessions(keys=[key], args=[repr(before), limit], client=pipe)
        claimed = await self._call("close sessions", pipe.execute())
        found = [SessionKey(t, sid) for t, ids in zip(tenants, claimed, strict=True) for sid in ids]
        return found
