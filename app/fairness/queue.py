# Admission to a saturated pool from one ingress replica: priority bands in strict
# precedence, the virtual token counter (``app.fairness.vtc``) within a band, a bounded
# wait, and shedding.
#
# Rule. A pool has a cap C: the requests this ingress replica may have in flight to it
# (the pool's engine slots, replicas × max_num_seqs, divided among the ingress
# replicas). A request is light when it is not batch and its tenant holds fewer than its
# fair part of C (C × s_t / Σ s over the active tenants: with requests running or
# waiting, or one that ended within the last two mean slot holds). A light request may
# take any free slot; any other only while more than R stay free: R is the headroom
# H = round(headroom × C) (at least one where headroom > 0 and C ≥ 2: a small cap, such
# as a pool split among ingress replicas, would otherwise keep none), raised to what the
# light requests' recent demand needs (``app.fairness.reserve``). A light tenant or an
# interactive request then finds a slot at once instead of waiting for the flood's next
# one to end.
# A request starts at once when a slot is free to it and nothing waits; otherwise it
# waits in its band's VTC queue. Each time a slot frees, the next to start is the VTC
# head of the highest band that has a waiter a free slot is open to (interactive, then
# standard, then batch). A start charges the request's prompt tokens to its tenant's
# counter in its band; its end charges its output tokens. Counters are per ingress
# replica: with K replicas that each get a like mix of requests, each serves its share
# of every tenant in the same order (bounded divergence, not shared state).
#
# Shedding (an OpenAI-shaped error with Retry-After; the request was admitted, so it
# ends with one ledger record, status "shed", and its reservation released):
#   - over_share (429): others wait too, and the tenant already has its fair part of
#     ``max_waiting`` waiting: ceil(max_waiting × s_t / Σ s over the waiting tenants);
#   - pool_full (503): ``max_waiting`` wait. A sheddable arrival (batch) is shed; any
#     other takes the place of the newest waiter of the lowest sheddable band (that one
#     is shed, pool_full), else of the newest waiter, in its band or below, of the
#     tenant furthest past its part (shed with over_share, 429), else is shed itself;
#   - queue_timeout (503): it waited ``max_wait_s``.
# Retry-After: ceil((waiting + 1) / C × the mean seconds a request holds its slot), at
# least 1.
#
# Engine caps: the engines' own reports may freeze C lower (``app.fairness.engine_caps``).
#
# Token caps: a slot is open only while the pool's token sums are below their caps
# (``app.fairness.token_caps``; off unless set).
#
# Parameters (``FairnessArgs``): cap per pool (from the pool), headroom (0.05) and
# headroom_sigmas (1.0, the reserve's z), max_waiting (256), max_wait_s (30), the bands
# and which are sheddable, VTC's input/output weights; the engine caps' three and the
# token caps' two (their modules).
"""``PoolQueue``: one pool's slots and waiters; ``Ticket``: one request's place."""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from app.engine.protocol import EngineLoad
from app.fairness.engine_caps import EngineCaps
from app.fairness.reserve import LightDemand
from app.fairness.token_caps import TokenBook, TokenCaps
from app.fairness.vtc import INPUT_WEIGHT, OUTPUT_WEIGHT, Vtc
from app.request import BANDS, QueueNote
from app.state.records import Priority as Band

SHEDDABLE: frozenset[Band] = frozenset({"batch"})
ShedReason = Literal["over_share", "pool_full", "queue_timeout"]
MEAN_WEIGHT = 0.1  # of each slot's hold time in the running mean (Retry-After)


class Shed(Exception):
    """A request the pool will not take now: 429 for a tenant over its share, else 503."""

    def __init__(self, reason: ShedReason, band: Band, retry_after_s: float) -> None:
        self.reason, self.band = reason, band
        self.retry_after_s = max(1, math.ceil(retry_after_s))
        self.status = 429 if reason == "over_share" else 503
        super().__init__(MESSAGES[reason])


MESSAGES: dict[ShedReason, str] = {
    "over_share": "The model is saturated and this tenant already has its share of the "
    "queue waiting; retry later.",
    "pool_full": "The model is saturated and its queue is full; retry later.",
    "queue_timeout": "The model stayed saturated for as long as a request may wait; retry later.",
}


@dataclass(frozen=True)
class QueueSettings:
    """``FairnessArgs`` (``app.config``) as the queue reads them."""

    max_waiting: int = 256
    max_wait_s: float = 30.0
    headroom: float = 0.05
    headroom_sigmas: float | None = 1.0  # z of app.fairness.reserve (None: H alone)
    input_weight: float = INPUT_WEIGHT
    output_weight: float = OUTPUT_WEIGHT
    engine_max_waiting: int = 2
    engine_max_kv_usage: float = 0.95
    engine_stale_s: float = 5.0
    max_prefill_tokens: int | None = None  # per engine replica
    max_kv_tokens: int | None = None  # per engine replica


@dataclass(eq=False)
class Ticket:
    """One request's place at a pool: waiting, then holding a slot until ``leave``."""

    queue: PoolQueue
    tenant: str
    band: Band
    share: float
    prompt_tokens: int
    arrived: float
    output_tokens: int = 0  # the most it may produce (its reserved KV: prompt + this)
    started: float | None = None  # when it got its slot
    prefilled: bool = False  # its first token came
    light: bool = False  # it started light (module comment)
    counter: float = 0.0  # its tenant's counter in its band when it started
    service: float = 0.0  # weighted tokens charged (prompt at start, output at leave)
    left: bool = False
    _future: asyncio.Future[None] | None = field(default=None, repr=False)

    @property
    def waited_s(self) -> float:
        end = self.started if self.started is not None else self.queue.clock()
        return max(0.0, end - self.arrived)

    async def wait(self) -> None:
        """Until it holds a slot; raises ``Shed`` when shed (cancelled: leaves the queue)."""
        await self.queue._wait(self)

    def observe(self, replica: str, load: EngineLoad) -> None:
        """Its first delta's view of the engine that serves it (``PoolQueue.observe``)."""
        self.queue.observe(replica, load)

    def first_token(self) -> None:
        """Its first token came: its prompt no longer waits for prefill (once)."""
        self.queue._prefilled(self)

    def leave(self, output_tokens: int = 0) -> None:
        """Give the slot back, charging ``output_tokens`` (once; nothing if never started)."""
        self.queue._leave(self, output_tokens)

    def note(self, shed: Shed | None = None) -> QueueNote:
        """What the outcome keeps of its turn (the route header, metrics, logs)."""
        reason = shed.reason if shed is not None else None
        return QueueNote(self.band, self.waited_s, self.counter, reason, self.service)


class PoolQueue:
    """The slots and waiters of one pool on one ingress replica (module comment)."""

    def __init__(
        self,
        cap: int,
        settings: QueueSettings = QueueSettings(),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        tokens: TokenCaps | None = None,
    ) -> None:
        """``clock``/``sleep``: the time waits are measured and bounded in (virtual time
        in simulations)."""
        if cap < 1:
            raise ValueError("a pool's cap must be ≥ 1")
        self.cap, self.settings, self.clock, self.sleep = cap, settings, clock, sleep
        self.tokens = TokenBook(tokens or TokenCaps())
        self.running = 0
        self._held: dict[str, int] = {}  # slots held, by tenant
        self._shares: dict[str, float] = {}  # of the tenants holding slots
        self._recent: dict[str, tuple[float, float]] = {}  # tenant → (last end, share)
        self._bands: dict[Band, Vtc[Ticket]] = {
            b: Vtc(settings.input_weight, settings.output_weight) for b in BANDS
        }
        self._hold_s = 1.0  # running mean of how long a request holds its slot
        self.light = LightDemand(settings.headroom_sigmas, clock)
        self.shed: dict[tuple[Band, ShedReason], int] = {}  # counts, for tests and reports
        self.engines = EngineCaps(
            settings.engine_max_waiting, settings.engine_max_kv_usage, settings.engine_stale_s,
            clock,
        )  # fmt: skip
        self._recheck: asyncio.Task[None] | None = None

    # ---- reading ---------------------------------------------------------------------

    @property
    def headroom(self) -> int:
        """H of the module comment, for the cap now."""
        h = self.settings.headroom
        return max(1, round(h * self.cap)) if h > 0 and self.cap >= 2 else 0

    def waiting(self, band: Band | None = None) -> int:
        bands = (band,) if band is not None else BANDS
        return sum(self._bands[b].waiting() for b in bands)

    def counter(self, tenant: str, band: Band = "standard") -> float:
        return self._bands[band].counter(tenant)

    def retry_after_s(self) -> float:
        return (self.waiting() + 1) / self.cap * self._hold_s

    def limit(self) -> int:
        """The cap now: C, or less while the engines are full (``app.fairness.engine_caps``)."""
        return self.engines.limit(self.cap)

    def observe(self, replica: str, load: EngineLoad) -> None:
        """A first delta's view of ``replica``'s engine."""
        if self.engines.observe(replica, load, self.running):
            self._next()
        elif self.engines.frozen is not None:
            self._recheck_later()

    def _recheck_later(self) -> None:
        """Let waiters in when the freeze lapses with nothing else happening."""
        if self._recheck is not None and not self._recheck.done():
            return
        try:
            self._recheck = asyncio.get_running_loop().create_task(self._after_stale())
        except RuntimeError:  # no loop (a synchronous caller): the next event re-checks
            self._recheck = None

    async def _after_stale(self) -> None:
        while self.engines.frozen is not None:
            await self.sleep(self.engines.due_s() + 1e-3)
            if self.limit() > self.running:
                self._next()

    # ---- one request -----------------------------------------------------------------

    def ticket(
        self,
        tenant: str,
        band: Band,
        prompt_tokens: int,
        share: float = 1.0,
        output_tokens: int = 0,
    ) -> Ticket:
        return Ticket(self, tenant, band, share, prompt_tokens, self.clock(), output_tokens)

    async def _wait(self, t: Ticket) -> None:
        if self.waiting() == 0 and self._open_to(t.tenant, t.band, t.share):
            self._start(t)
            return
        self._make_room(t)
        fut = t._future = asyncio.get_running_loop().create_future()
        self._bands[t.band].push(t.tenant, t, t.share)
        self._next()  # a slot may be open to it (headroom) though others wait
        if fut.done():
            return
        timer = asyncio.ensure_future(self.sleep(self.settings.max_wait_s))
        try:
            await asyncio.wait((fut, timer), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            timer.cancel()
            started = fut.done() and not fut.cancelled() and fut.exception() is None
            if started:
                self._leave(t, 0)  # it got the slot as its client left
            else:
                self._bands[t.band].remove(t.tenant, t)
                fut.cancel()
            raise
        timer.cancel()
        if fut.done():
            fut.result()  # started, or shed (evicted) while waiting
            return
        self._bands[t.band].remove(t.tenant, t)
        fut.cancel()
        raise self._shed(t, "queue_timeout")

    def _open_to(self, tenant: str, band: Band, share: float | None = None) -> bool:
        """A free slot may go to this tenant's request of ``band`` (the headroom rule)."""
        free = self.limit() - self.running
        if free <= 0 or not self.tokens.room():
            return False
        return self._light(tenant, band, share) or free > self.reserve()

    def slots(self) -> dict[str, Callable[[], float]]:
        """Readers of the slots and token sums, by ``switchyard_queue_slots``' kind."""
        t = self.tokens
        return {"cap": self.limit, "running": lambda: self.running,
                "light": lambda: self.light.held, "reserved": self.reserve,
                "prefill_tokens": lambda: t.pending_prefill,
                "kv_tokens": lambda: t.reserved_kv}  # fmt: skip

    def reserve(self) -> int:
        """R of the module comment: the free slots a request that is not light leaves."""
        return self.light.reserve(self.cap, self.headroom, self._hold_s)

    def _light(self, tenant: str, band: Band, share: float | None) -> bool:
        """Not batch, and the tenant holds less than its fair part of the cap."""
        if band in SHEDDABLE:
            return False
        shares = {**self._recent_shares(), **self._shares, **self._waiting_shares()}
        mine = share if share is not None else shares.get(tenant, 1.0)
        shares[tenant] = mine
        return self._held.get(tenant, 0) < self.cap * mine / sum(shares.values())

    def _recent_shares(self) -> dict[str, float]:
        """Tenants whose last request ended within two mean holds (then forgotten)."""
        since = self.clock() - 2 * self._hold_s
        for name in [n for n, (at, _) in self._recent.items() if at < since]:
            del self._recent[name]
        return {name: share for name, (_, share) in self._recent.items()}

    def _make_room(self, t: Ticket) -> None:
        """Shed ``t`` (raise) or a waiter in its place, by the module comment's rule."""
        s = self.settings
        shares = {**self._waiting_shares(), t.tenant: t.share}
        total = sum(shares.values())
        if len(shares) > 1 and self._waiting_of(t.tenant) >= self._part(t.share, total):
            raise self._shed(t, "over_share")
        if self.waiting() < s.max_waiting:
            return
        if t.band not in SHEDDABLE:
            for band in reversed(BANDS):
                if band in SHEDDABLE and band != t.band and self._evict_newest(band, None):
                    return
        # a tenant past its part of the queue gives up its newest waiter to one under its own
        over = {name: self._waiting_of(name) - self._part(share, total)
                for name, share in shares.items() if name != t.tenant}  # fmt: skip
        worst = max(over, key=lambda name: over[name], default=None)
        if worst is not None and over[worst] > 0:
            lower = BANDS[BANDS.index(t.band) :]
            if any(self._evict_newest(band, worst) for band in reversed(lower)):
                return
        raise self._shed(t, "pool_full")

    def _part(self, share: float, total: float) -> int:
        """A tenant's fair part of ``max_waiting`` among waiting shares summing to ``total``."""
        return math.ceil(self.settings.max_waiting * share / total)

    def _waiting_of(self, tenant: str) -> int:
        return sum(self._bands[b].waiting(tenant) for b in BANDS)

    def _waiting_shares(self) -> dict[str, float]:
        return {
            name: share for b in BANDS for name, share in self._bands[b].backlogged_shares().items()
        }

    def _evict_newest(self, band: Band, tenant: str | None) -> bool:
        """Shed the newest waiter of ``band`` (of ``tenant``'s only, when given): 503
        pool_full for a sheddable band's, 429 over_share for a tenant past its part."""
        newest = self._bands[band].pop_newest(tenant)
        if newest is None:
            return False
        _, victim = newest
        assert victim._future is not None
        victim._future.set_exception(self._shed(victim, "over_share" if tenant else "pool_full"))
        return True

    def _shed(self, t: Ticket, reason: ShedReason) -> Shed:
        key = (t.band, reason)
        self.shed[key] = self.shed.get(key, 0) + 1
        return Shed(reason, t.band, self.retry_after_s())

    def _start(self, t: Ticket) -> None:
        t.light = self._light(t.tenant, t.band, t.share)
        if t.light:
            self.light.change(+1, self._hold_s)
        self.running += 1
        self.tokens.start(t.prompt_tokens, t.output_tokens)
        self._held[t.tenant] = self._held.get(t.tenant, 0) + 1
        self._shares[t.tenant] = t.share
        t.started = self.clock()
        vtc = self._bands[t.band]
        t.service += vtc.charge(t.tenant, prompt_tokens=t.prompt_tokens)
        t.counter = vtc.counter(t.tenant)

    def _leave(self, t: Ticket, output_tokens: int) -> None:
        if t.left or t.started is None:
            return
        t.left = True
        self.running -= 1
        if t.light:
            self.light.change(-1, self._hold_s)
        self.tokens.leave(t.prompt_tokens, t.output_tokens, t.prefilled)
        self._held[t.tenant] -= 1
        if not self._held[t.tenant]:
            del self._held[t.tenant], self._shares[t.tenant]
        self._recent[t.tenant] = (self.clock(), t.share)
        t.service += self._bands[t.band].charge(t.tenant, output_tokens=output_tokens)
        held = max(0.0, self.clock() - t.started)
        self._hold_s += MEAN_WEIGHT * (held - self._hold_s)
        self._next()

    def _prefilled(self, t: Ticket) -> None:
        if t.prefilled or t.left or t.started is None:
            return
        t.prefilled = True
        self.tokens.prefilled(t.prompt_tokens)
        self._next()

    def _next(self) -> None:
        while self.running < self.limit():
            nxt = self._pop()
            if nxt is None:
                return
            fut = nxt._future
            if fut is None or fut.done():
                continue  # gone meanwhile (cancelled, shed)
            self._start(nxt)
            fut.set_result(None)

    def _pop(self) -> Ticket | None:
        for band in BANDS:
            got = self._bands[band].pop(functools.partial(self._open_for, band))
            if got is not None:
                return got[1]
        return None

    def _open_for(self, band: Band, tenant: str) -> bool:
        return self._open_to(tenant, band)
