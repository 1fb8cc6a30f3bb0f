"""Re-sending journaled settlements until the store has them.

Rule: a settlement the store did not take is appended to the replica's journal
(``app.gateway.journal``, fsync'd) and re-sent, unchanged, by one background task:
after ``backoff.initial_s``, then backing off exponentially up to ``backoff.max_s``
while passes fail; any store answer (an admission, a heartbeat) wakes it early, never
more than once per ``initial_s``. A pass goes oldest first and stops at the first
failure (that entry goes to the back). The store settles a request id once, so an
entry that landed before its call failed is billed once. ``drain`` takes over for a
bounded time at shutdown; what is left stays on disk for the next gate on the folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from app.gateway.journal import Backoff, SettleJournal
from app.state.protocol import SettleRequest

log = logging.getLogger("app.gateway.admission")


class Resender:
    def __init__(
        self,
        journal: SettleJournal,
        settle: Callable[[SettleRequest], Awaitable[bool]],
        timeout_s: float,
        backoff: Backoff,
        on_pending: Callable[[int], None],
        on_journaled: Callable[[], None],
    ) -> None:
        """``settle`` writes one settlement to the store (looked up at each call, so a
        gate whose store is swapped re-sends to the new one)."""
        self.journal = journal
        self._settle = settle
        self._timeout_s = timeout_s
        self._backoff = backoff
        self._on_pending = on_pending
        self._on_journaled = on_journaled
        self._retrying: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._last_try = 0.0  # monotonic time of the last re-send pass

    def open(self) -> None:
        """Take this replica's journal file and whatever earlier processes left."""
        try:
            loaded = self.journal.open()
        except OSError as exc:
            log.error(
                "settlement journal in %s unusable (%r): settlements the store does not "
                "take are kept in memory only",
                self.journal.directory,
                exc,
            )
            return
        if self.journal:
            log.warning(
                "replaying %d settlements journaled by earlier processes (%s)",
                len(self.journal),
                ", ".join(p.name for p in loaded),
            )
            self._on_pending(len(self.journal))
            with contextlib.suppress(RuntimeError):  # no loop yet: the first call starts it
                self.ensure_running()

    async def add(self, s: SettleRequest, exc: BaseException) -> None:
        """Journal a settlement the store did not take (``exc`` says why)."""
        r = s.record
        try:
            durable = await self.journal.append(s)
        except Exception as err:  # never lose the record silently
            log.error("settlement journal failed (%r): %s", err, r.model_dump_json())
            durable = False
        self._on_journaled()
        self._on_pending(len(self.journal))
        log.warning(
            "settlement journaled%s, the store did not take it (%r): request %s tenant %s "
            "tokens %d (prompt %d, completion %d); %d pending",
            "" if durable else " IN MEMORY ONLY",
            exc,
            r.request_id,
            r.tenant,
            s.used_tokens,
            r.prompt_tokens,
            r.completion_tokens,
            len(self.journal),
        )
        if not durable:  # lost if this process ends before the store is back
            log.error("ledger record kept in memory only: %s", r.model_dump_json())
        self.ensure_running()

    def ensure_running(self) -> None:
        """Start the re-send task while settlements are pending (needs a running loop)."""
        if self.journal and (self._retrying is None or self._retrying.done()):
            self._retrying = asyncio.get_running_loop().create_task(self._retry())

    def store_answered(self) -> None:
        if self.journal:
            self._wake.set()

    async def _retry(self) -> None:
        delay = self._backoff.initial_s
        while self.journal:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            early = self._backoff.initial_s - (time.monotonic() - self._last_try)
            if early > 0:
                await asyncio.sleep(early)
            written = await self._resend()
            delay = self._backoff.initial_s if written else self._backoff.next(delay)

    async def _resend(self) -> int:
        """One pass over the journal; returns how many the store took."""
        self._last_try = time.monotonic()
        written = 0
        for s in self.journal.pending:
            try:
                await asyncio.wait_for(self._settle(s), self._timeout_s)
            except Exception as exc:
                self.journal.requeue(s)
                log.debug("settlement %s still not taken: %r", s.admit.request_id, exc)
                break
            self.journal.discard(s.admit.request_id)  # written now, or before (no-op)
            written += 1
        if written:
            await self.journal.compact()
            self._on_pending(len(self.journal))
            if not self.journal:
                log.info("settlement journal drained: the store has every journaled settlement")
            else:
                log.info("%d journaled settlements written, %d pending", written, len(self.journal))
        return written

    async def drain(self, deadline_s: float) -> None:
        """Try to write the journal to the store for up to ``deadline_s``; what is still
        pending stays in the journal (on disk: replayed by the next gate on its folder)."""
        if not self.journal:
            return
        end = time.monotonic() + deadline_s
        await self._stop()  # this loop takes over until the deadline
        delay = self._backoff.initial_s
        while self.journal and (left := end - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(self._resend(), left):
                    delay = self._backoff.initial_s
                    continue
            left = end - time.monotonic()
            if left > 0 and self.journal:
                await asyncio.sleep(min(delay, left))
                delay = self._backoff.next(delay)
        if self.journal:
            log.warning(
                "%d settlements still pending after the drain; %s",
                len(self.journal),
                f"kept in {self.journal.path}" if self.journal.durable else "LOST on exit",
            )
            self.ensure_running()  # the gate may serve on (``close`` stops it)

    async def _stop(self) -> None:
        if self._retrying is not None:
            self._retrying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retrying
            self._retrying = None

    async def close(self) -> None:
        """Stop re-sending and let go of the journal file (an empty one is deleted)."""
        await self._stop()
        await self.journal.close()
