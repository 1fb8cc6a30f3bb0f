"""The ledger reads of ``RedisStore``: a tenant's records in order (its stream), several
tenants merged by entry id (the settling Redis's clock, then tenant), one record through
a tenant's id index, a session's records through the tenant's session index. Writes
happen in the settle and sweep scripts (``redis_store``)."""

from __future__ import annotations

from typing import Any

from app.state.protocol import LedgerQuery
from app.state.records import LedgerRecord

_PAGE = 500


class RedisLedger:
    """Mixed into ``RedisStore``, which provides the connection and key helpers."""

    _redis: Any

    def _k(self, *parts: str) -> str:
        raise NotImplementedError

    def _tk(self, tenant: str, *parts: str) -> str:
        raise NotImplementedError

    async def _call(self, what: str, awaitable: Any) -> Any:
        raise NotImplementedError

    async def _ledger_tenants(self, query: LedgerQuery) -> list[str]:
        if query.tenant is not None:
            return [query.tenant]
        members = await self._call(
            "query ledger", self._redis.smembers(self._k("ledger", "tenants"))
        )
        return sorted(members)

    async def query_ledger(self, query: LedgerQuery) -> list[LedgerRecord]:
        """Oldest first; the newest ``limit`` records, newest first, when ``limit`` is set.
        Filters on ``ended_at`` (since inclusive, until exclusive), tenant and request id.
        One tenant's records come in the order of its stream; several tenants' merge by
        entry id (the settling Redis's clock), then tenant."""
        if query.limit is not None and query.limit <= 0:
            return []
        tenants = await self._ledger_tenants(query)
        if not tenants:
            return []
        if query.request_id is not None:
            return await self._ledger_record(tenants, query)
        if query.session_id is not None:
            return await self._session_records(tenants, query)
        newest_first = query.limit is not None
        count = _PAGE if query.limit is None else min(_PAGE, query.limit)
        cursors = dict.fromkeys(tenants, "+" if newest_first else "-")
        found: list[tuple[tuple[int, int, str], LedgerRecord]] = []
        taken = dict.fromkeys(tenants, 0)
        while cursors:
            pipe = self._redis.pipeline(transaction=False)
            for t, cursor in cursors.items():
                if newest_first:
                    pipe.xrevrange(self._tk(t, "ledger"), cursor, "-", count=count)
                else:
                    pipe.xrange(self._tk(t, "ledger"), cursor, "+", count=count)
            pages = await self._call("query ledger", pipe.execute())
            more: dict[str, str] = {}
            for t, entries in zip(list(cursors), pages, strict=True):
                for entry_id, fields in entries:
                    rec = LedgerRecord.model_validate_json(fields["record"])
                    if self._matches(rec, query):
                        found.append((self._order(entry_id, t), rec))
                        taken[t] += 1
                        if query.limit is not None and taken[t] >= query.limit:
                            break
                else:  # the whole page was read: the stream may go on
                    if len(entries) == count:
                        more[t] = "(" + entries[-1][0]
            cursors = more
            count = min(_PAGE, count * 4)  # a filter may skip many: read more next time
        found.sort(key=lambda item: item[0], reverse=newest_first)
        out = [rec for _, rec in found]
        return out if query.limit is None else out[: query.limit]

    async def _ledger_record(self, tenants: list[str], query: LedgerQuery) -> list[LedgerRecord]:
        """The record of ``query.request_id`` through the tenants' id indexes (no scan)."""
        assert query.request_id is not None
        pipe = self._redis.pipeline(transaction=False)
        for t in tenants:
            pipe.hget(self._tk(t, "ledger", "ids"), query.request_id)
        hits = [
            (t, entry_id)
            for t, entry_id in zip(
                tenants, await self._call("query ledger", pipe.execute()), strict=True
            )
            if entry_id is not None
        ]
        if not hits:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for t, entry_id in hits:
            pipe.xrange(self._tk(t, "ledger"), entry_id, entry_id)
        found = [
            (self._order(entry_id, t), LedgerRecord.model_validate_json(entries[0][1]["record"]))
            for (t, entry_id), entries in zip(
                hits, await self._call("query ledger", pipe.execute()), strict=True
            )
            if entries
        ]
        found.sort(key=lambda item: item[0])
        return [rec for _, rec in found if self._matches(rec, query)][:1]

    async def _session_records(
        self, tenants: list[str], query: LedgerQuery
    ) -> list[LedgerRecord]:
        """A session's records through the tenant's session index (no scan)."""
        assert query.session_id is not None and len(tenants) == 1, "a session needs its tenant"
        t = tenants[0]
        listed = await self._call(
            "query ledger", self._redis.hget(self._tk(t, "ledger", "sessions"), query.session_id)
        )
        if not listed:
            return []
        ids = listed.split(",")
        pipe = self._redis.pipeline(transaction=False)
        for entry_id in ids:
            pipe.xrange(self._tk(t, "ledger"), entry_id, entry_id)
        pages = await self._call("query ledger", pipe.execute())
        found = [  # a lost record replaced by its settlement is gone from the stream
            (self._order(entry_id, t), LedgerRecord.model_validate_json(fields["record"]))
            for entries in pages
            for entry_id, fields in entries[:1]
        ]
        found.sort(key=lambda item: item[0], reverse=query.limit is not None)
        out = [rec for _, rec in found if self._matches(rec, query)]
        return out if query.limit is None else out[: query.limit]

    @staticmethod
    def _order(entry_id: str, tenant: str) -> tuple[int, int, str]:
        ms, _, seq = entry_id.partition("-")
        return int(ms), int(seq), tenant

    @staticmethod
    def _matches(rec: LedgerRecord, q: LedgerQuery) -> bool:
        return (
            (q.tenant is None or rec.tenant == q.tenant)
            and (q.request_id is None or rec.request_id == q.request_id)
            and (q.session_id is None or rec.session_id == q.session_id)
            and (q.since is None or rec.ended_at >= q.since)
            and (q.until is None or rec.ended_at < q.until)
        )

