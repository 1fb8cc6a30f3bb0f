"""The gateway's copy of the router's ``RouteTable``.

Decisions are made locally against the snapshot (no hop per request). The snapshot
is refreshed from the router deployment in the background every ``refresh_s`` and,
at most once per ``refresh_s``, on a miss (so a newly added model appears without
waiting, while unknown-model floods cannot hammer the router).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from app.routing.table import (
    Acceptance,
    LiveLatency,
    Routable,
    RouteDecision,
    RouteTable,
    no_acceptance,
    no_live,
)

log = logging.getLogger(__name__)


class RouteSnapshot:
    def __init__(self, router: Any, table: RouteTable, refresh_s: float = 5.0) -> None:
        self._router = router
        self._table = table
        self._refresh_s = refresh_s
        self._last_refresh = time.monotonic()
        self._refreshing: asyncio.Task[None] | None = None

    @property
    def table(self) -> RouteTable:
        return self._table

    async def decide(
        self,
        request: Routable,
        live: LiveLatency | None = None,
        acceptance: Acceptance = no_acceptance,
    ) -> RouteDecision | None:
        """Raises ``NoRouteFits`` for a policy alias with no fitting candidate."""
        live = live or no_live
        decision = self._table.decide(request, live=live, acceptance=acceptance)
        due = time.monotonic() - self._last_refresh >= self._refresh_s
        if decision is None and due:
            await self.refresh()
            return self._table.decide(request, live=live, acceptance=acceptance)
        if due and self._refreshing is None:
            self._refreshing = asyncio.create_task(self._background_refresh())
        return decision

    async def refresh(self, strict: bool = False) -> None:
        """Take the router's table if it is newer. A failed call keeps the current
        table, or raises with ``strict`` (the replica's first snapshot)."""
        self._last_refresh = time.monotonic()
        try:
            newer = await self._router.table.remote(self._table.version)
        except Exception:  # keep serving from the last good table
            if strict:
                raise
            log.warning("route table refresh failed; keeping version %d", self._table.version)
            return
        if newer is not None:
            self._table = newer

    async def _background_refresh(self) -> None:
        try:
            await self.refresh()
        finally:
            self._refreshing = None
