"""Agent sessions on one ingress replica: refusing the calls of a cancelled session,
cancelling a whole session on every replica, ending idle sessions into the metrics.

Rules and parameters:
- A call carrying ``x-session-id`` first tells the store (``StateStore.session_call``);
  a call of a cancelled session is refused (409 ``session_cancelled``) until the
  cancellation expires, ``sessions.cancel_ttl_s`` after it was made. When the store
  cannot be reached the gateway's ``on_store_failure`` decides: ``fail_open`` serves the
  call unchecked, ``fail_closed`` refuses it (503).
- ``cancel``: the store marks the session cancelled and appends it to the cancel feed;
  this replica cancels its own calls of the session at once, every replica (this one
  again, harmlessly) when it reads the feed. Each replica follows the feed from its end
  at start-up, waiting up to ``feed_wait_s`` per read (0.6 × the store timeout, at most
  1 s); a failed read is retried after ``RETRY_S``. While the replica has no live call
  of any session (``has_session_calls``) it does not read, only looks again every
  ``IDLE_S``: its cursor stays where it was, so the first read after a session call
  started sees every cancel made since (an idle gateway costs its store nothing). A
  cancellation read is remembered for ``RECENT_S`` (at most ``RECENT_MAX`` sessions),
  so a call that registers just after its message was read is cancelled too
  (``cancelled_here``).
- Every ``close_every_s`` = ``idle_s`` / 4 (from 0.25 s to 30 s) the replica claims the
  sessions idle for ``idle_s`` (each claimed by exactly one replica), tallies each from
  its ledger records (``app.sessions.tally``) and observes its metrics once: duration,
  calls and SLO verdict, by tenant label (``gateway.metrics_tenants``, else ``other``).
  A session id used again after its session ended starts it again and is counted again
  when it ends, with all its calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from app.config import SessionsConfig
from app.observability.metrics import GatewayMetrics
from app.sessions.tally import SessionTally, tally
from app.state.protocol import LedgerQuery, SessionKey, StateStore, StoreUnavailable

log = logging.getLogger(__name__)

RETRY_S = 1.0
IDLE_S = 0.25
RECENT_S = 60.0
RECENT_MAX = 10_000


class SessionCancelled(Exception):
    """A call of a cancelled session (409 ``session_cancelled``)."""

    def __init__(self, session_id: str, until: float | None = None) -> None:
        super().__init__(session_id)
        self.session_id = session_id
        self.until = until


class SessionBook:
    """One ingress replica's side of agent sessions (module docstring)."""

    def __init__(
        self,
        store: StateStore,
        config: SessionsConfig,
        metrics: GatewayMetrics,
        *,
        cancel_calls: Callable[[SessionKey], int],
        has_session_calls: Callable[[], bool] = lambda: True,
        store_timeout_s: float = 0.5,
        fail_open: bool = False,
    ) -> None:
        self._store = store
        self.config = config
        self._metrics = metrics
        self._cancel_calls = cancel_calls
        self._has_session_calls = has_session_calls
        self._fail_open = fail_open
        self.feed_wait_s = min(1.0, 0.6 * store_timeout_s)
        self.close_every_s = min(30.0, max(0.25, config.idle_s / 4))
        self._recent: dict[SessionKey, float] = {}  # cancellations read -> monotonic time
        self._tasks: list[asyncio.Task[None]] = []

    # ---- calls -----------------------------------------------------------------------

    async def admit(self, tenant: str, session_id: str) -> None:
        """Before a call of the session is admitted: raise ``SessionCancelled`` when the
        session is cancelled (module docstring)."""
        key = SessionKey(tenant, session_id)
        if self.cancelled_here(key):
            raise SessionCancelled(session_id)
        try:
            until = await self._store.session_call(tenant, session_id, time.time())
        except StoreUnavailable:
            self._metrics.store_failures.labels("session").inc()
            if self._fail_open:
                return
            raise
        if until is not None:
            raise SessionCancelled(session_id, until)

    def cancelled_here(self, key: SessionKey) -> bool:
        seen = self._recent.get(key)
        return seen is not None and time.monotonic() - seen < RECENT_S

    # ---- cancel and read -------------------------------------------------------------

    async def cancel(self, tenant: str, session_id: str) -> bool:
        """Cancel the session everywhere; False when the tenant has no such session."""
        until = time.time() + self.config.cancel_ttl_s
        if not await self._store.cancel_session(tenant, session_id, until):
            return False
        self._metrics.session_cancels.labels(self._metrics.tenant_label(tenant)).inc()
        self._cancelled(SessionKey(tenant, session_id))
        return True

    def _cancelled(self, key: SessionKey) -> None:
        now = time.monotonic()
        if len(self._recent) >= RECENT_MAX:
            self._recent = {k: t for k, t in self._recent.items() if now - t < RECENT_S}
            while len(self._recent) >= RECENT_MAX:
                del self._recent[next(iter(self._recent))]
        self._recent[key] = now
        cancelled = self._cancel_calls(key)
        if cancelled:
            label = self._metrics.tenant_label(key.tenant)
            self._metrics.session_cancelled_calls.labels(label).inc(cancelled)
            log.info("session cancel: %d calls cancelled on this replica", cancelled)

    async def tally(self, tenant: str, session_id: str) -> SessionTally | None:
        """The session's tally, or None when the tenant has no such session."""
        state = await self._store.session_state(tenant, session_id)
        if not state.known:
            return None
        records = await self._store.query_ledger(LedgerQuery(tenant=tenant, session_id=session_id))
        return tally(session_id, records, state, self.config.slo_for(tenant))

    # ---- background ------------------------------------------------------------------

    def start(self) -> None:
        """Follow the cancel feed and end idle sessions (on the running loop)."""
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._follow()), loop.create_task(self._close())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _follow(self) -> None:
        cursor: str | None = None
        failing = False
        while True:
            if cursor is not None and not self._has_session_calls():
                await asyncio.sleep(IDLE_S)
                continue
            try:
                found, cursor = await self._store.session_cancels(cursor, self.feed_wait_s)
            except Exception as exc:
                if not failing:
                    log.warning("cannot read the session cancel feed: %r", exc)
                failing = True
                await asyncio.sleep(RETRY_S)
                continue
            failing = False
            for key in found:
                self._cancelled(key)

    async def _close(self) -> None:
        while True:
            await asyncio.sleep(self.close_every_s)
            try:
                await self.close_idle()
            except Exception as exc:
                log.warning("closing idle sessions failed: %r", exc)

    async def close_idle(self) -> int:
        """Claim the sessions idle for ``idle_s`` and observe their metrics once each."""
        ended = await self._store.close_idle_sessions(time.time() - self.config.idle_s)
        for key in ended:
            t = await self.tally(key.tenant, key.session_id)
            if t is None or t.calls == 0:
                continue
            label = self._metrics.tenant_label(key.tenant)
            self._metrics.session_duration.labels(label).observe(t.wall_s)
            self._metrics.session_calls.labels(label).observe(t.calls)
            self._metrics.sessions.labels(label, t.slo).inc()
        return len(ended)
