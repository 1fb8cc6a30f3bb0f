"""The gate: rate limits and budget reservation before dispatch, exact settlement after.

Rule: a request is admitted by one atomic ``store.admit`` (see ``app.state.protocol``)
that takes its request and token units, a concurrency slot and a budget reservation
of ``prompt + allowance`` tokens, where the allowance — the request's new
``max_tokens`` — is what the tightest budget leaves. Every admitted request is
settled exactly once, whatever happens to it (completion, engine error, client gone):
the reservation is replaced by the tokens actually processed, and the ledger record
is written in the same atomic step. Live reservations are refreshed every
``ttl / 3`` so only a crashed replica's reservations expire.

Store failure policy: ``fail_closed`` answers 503; ``fail_open`` admits against a
local in-memory store (limits per replica, logged and counted) until the store
answers again.

A settlement the store does not take (down, or no answer within ``store_timeout_s``)
is never dropped: it goes to the replica's settlement journal (``app.gateway.journal``,
fsync'd before it counts as journaled) and a background task re-sends it, unchanged,
with exponential backoff until the store has it — the store ignores a request id it
settled already, so one that landed before its call failed is billed once. Success
against the store (an admission, a heartbeat) wakes the retry early. ``drain`` flushes
the journal for a bounded time; what is left stays on disk, and the next gate on that
directory (this replica restarted, or a sibling) replays it at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.config import GatewayArgs
from app.gateway.journal import Backoff, SettleJournal
from app.gateway.plan import Plan
from app.gateway.resend import Resender
from app.request import Caller, InferenceRequest, Outcome
from app.state.protocol import (
    AdmitRequest,
    AdmitResult,
    Price,
    RateState,
    SettleRequest,
    StateStore,
    StoreUnavailable,
)
from app.state.records import LedgerRecord
from app.state.sqlite_store import SqliteStore

log = logging.getLogger(__name__)

DRAIN_DEADLINE_S = 5.0


@dataclass
class Refused(Exception):
    """429: a rate limit, the concurrency limit or a budget refused the request."""

    reason: str  # requests | tokens | concurrency | budget
    retry_after_s: float
    headers: dict[str, str]

    def message(self) -> str:
        return {
            "requests": "Rate limit reached for requests per minute.",
            "tokens": "Rate limit reached for tokens per minute.",
            "concurrency": "Too many concurrent requests.",
            "budget": "You exceeded your token or spending budget for this period.",
        }[self.reason]


@dataclass
class Admission:
    """An admitted request: the request itself (unchanged), what the store holds for it
    (``request`` is the store's ``AdmitRequest``), and the store's answer."""

    inference: InferenceRequest
    request: AdmitRequest
    result: AdmitResult
    local: bool = False  # admitted by the fail-open local store
    started_wall: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)

    @property
    def caller(self) -> Caller:
        assert self.inference.caller is not None
        return self.inference.caller

    @property
    def requested_max_tokens(self) -> int | None:
        return self.inference.max_tokens

    @property
    def max_tokens(self) -> int | None:
        """The max_tokens of each choice to send to the engine: the allowance (shared by
        the ``n`` choices) when a budget capped it."""
        if not self.request.budgets:
            return self.requested_max_tokens
        return self.result.allowance // self.inference.n

    @property
    def capped(self) -> bool:
        per_choice = self.result.allowance // self.inference.n
        return self.request.budgets != () and (
            self.requested_max_tokens is None or per_choice < self.requested_max_tokens
        )

    def headers(self) -> dict[str, str]:
        return rate_headers(self.result.rates)


def _duration(seconds: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``120ms``."""
    millis = max(0, round(seconds * 1000))
    if millis < 1000:  # 0.9996 s is "1s", not "1000ms"
        return f"{millis}ms"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def rate_headers(rates: tuple[RateState, ...]) -> dict[str, str]:
    """``x-ratelimit-*`` for the tightest request bucket and the tightest token bucket."""
    out: dict[str, str] = {}
    for kind in ("requests", "tokens"):
        states = [r for r in rates if r.kind == kind]
        if not states:
            continue
        tight = min(states, key=lambda r: (r.remaining, -r.reset_s))
        out[f"x-ratelimit-limit-{kind}"] = str(tight.limit)
        out[f"x-ratelimit-remaining-{kind}"] = str(tight.remaining)
        out[f"x-ratelimit-reset-{kind}"] = _duration(tight.reset_s)
    return out


class Gate:
    def __init__(
        self,
        store: StateStore,
        options: GatewayArgs,
        *,
        replica: str | None = None,
        observe: Callable[[str, float], None] | None = None,
        on_settled: Callable[[LedgerRecord], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        journal_dir: Path | None = None,
        retry: Backoff | None = None,
        on_pending: Callable[[int], None] | None = None,
        on_journaled: Callable[[], None] | None = None,
    ) -> None:
        """``journal_dir``: where settlements the store did not take are kept (None:
        in memory only); ``retry``: the backoff of their re-sends; ``on_pending`` gets
        the number pending whenever it changes, ``on_journaled`` is called once per
        settlement journaled."""
        self._store = store
        self._options = options
        self._replica = replica
        self._observe = observe or (lambda op, seconds: None)
        self._on_settled = on_settled or (lambda record: None)
        self._local: SqliteStore | None = None
        self._live: dict[str, Admission] = {}
        self._settling: set[asyncio.Task[None]] = set()
        self._heartbeat: asyncio.Task[None] | None = None
        self._on_failure = on_failure or (lambda op: None)
        self.store_failures = 0
        self.journal = SettleJournal(journal_dir, replica)
        self._resender = Resender(
            self.journal,
            lambda request: self._store.settle(request),
            options.store_timeout_s,
            retry or Backoff(),
            on_pending or (lambda n: None),
            on_journaled or (lambda: None),
        )
        self._resender.open()

    # ---- admission -----------------------------------------------------------------

    async def admit(
        self,
        inference: InferenceRequest,
        plan: Plan,
        *,
        prompt_tokens: int,
        context_left: int,
        price: Price,
        counted_prompt_tokens: int | None = None,
    ) -> Admission:
        """``inference.id`` is the gateway's id (unique per request): the store's key for
        the reservation and the ledger record's id; ``inference.caller`` is required.

        A request that holds a concurrency slot or a budget carries its ``lost`` record
        to the store (``AdmitRequest.pending``): written by ``sweep_lost`` if this
        replica dies before settling it — ``http_status`` 0 (no response status is
        known: the client saw the connection drop), billed the prompt tokens at the
        input price (``counted_prompt_tokens`` when the gateway counted the prompt but
        reserves nothing for it, else ``prompt_tokens``). One admitted without store
        state (an empty plan, or rate limits only) is settled from memory only: a crash
        leaves no record of it."""
        caller = inference.caller
        assert caller is not None, "admission needs the caller"
        requested_max_tokens = inference.max_tokens
        want = context_left if requested_max_tokens is None else requested_max_tokens
        rid = inference.id
        started_wall = time.time()
        pending = None
        lost_prompt = prompt_tokens if counted_prompt_tokens is None else counted_prompt_tokens
        if plan.concurrency or plan.budgets:
            pending = LedgerRecord(
                request_id=rid,
                client_request_id=inference.client_request_id,
                session_id=inference.session_id,
                session_slo_ms=inference.session_slo_ms,
                tenant=caller.tenant,
                team=caller.team,
                user=caller.user,
                key_id=caller.key_id,
                model_requested=inference.model,
                adapter=inference.adapter.id if inference.adapter is not None else None,
                endpoint=inference.endpoint,
                status="lost",
                http_status=0,
                prompt_tokens=lost_prompt,
                cost_usd=lost_prompt * price.input,
                e2e_s=0.0,  # the store sets e2e_s and ended_at at expiry
                started_at=started_wall,
                ended_at=started_wall,
                ingress=self._replica,
            )
        request = AdmitRequest(
            request_id=rid,
            rates=plan.rates,
            concurrency=plan.concurrency,
            budgets=plan.budgets,
            prompt_tokens=prompt_tokens,
            max_output_tokens=max(0, want) * inference.n,  # every choice counts
            min_output_tokens=self._options.min_output_tokens * inference.n,
            price=price,
            ttl_s=self._options.reservation_ttl_s,
            pending=pending,
        )
        local = False
        if plan.empty:
            result = AdmitResult(True, allowance=request.max_output_tokens)
        else:
            started = time.perf_counter()
            try:
                result = await asyncio.wait_for(
                    self._store.admit(request), self._options.store_timeout_s
                )
            except (StoreUnavailable, TimeoutError) as exc:
                result = await self._admit_locally(request, exc)
                local = True
            else:
                self._resender.store_answered()
            self._observe("admit", time.perf_counter() - started)
        if not result.admitted:
            assert result.reason is not None
            headers = rate_headers(result.rates)
            if result.retry_after_s > 0:
                headers["Retry-After"] = str(max(1, round(result.retry_after_s)))
            raise Refused(result.reason, result.retry_after_s, headers)
        admission = Admission(inference, request, result, local=local, started_wall=started_wall)
        self._live[request.request_id] = admission
        self._ensure_heartbeat()
        self._resender.ensure_running()  # a journal replayed at start-up, before any loop ran
        return admission

    async def _admit_locally(self, request: AdmitRequest, exc: BaseException) -> AdmitResult:
        self.store_failures += 1
        self._on_failure("admit")
        if self._options.on_store_failure == "fail_closed":
            log.error("state store unavailable, refusing (fail_closed): %r", exc)
            raise StoreUnavailable("the rate-limit store is unavailable") from exc
        log.warning("state store unavailable, admitting on local limits (fail_open): %r", exc)
        if self._local is None:
            self._local = SqliteStore(":memory:")
        return await self._local.admit(request)

    # ---- settlement ----------------------------------------------------------------

    def settle(self, admission: Admission, outcome: Outcome) -> asyncio.Task[None] | None:
        """Settle in the background: a cancelled handler cannot interrupt it. The task,
        or None when it was settled already."""
        if self._live.pop(admission.request.request_id, None) is None:
            return None  # settled already
        task = asyncio.get_running_loop().create_task(self._settle(admission, outcome))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        return task

    async def _settle(self, a: Admission, o: Outcome) -> None:
        price = a.request.price
        uncached = max(0, o.prompt_tokens - o.cached_tokens)
        cost = (
            uncached * price.input
            + o.cached_tokens * price.cached_input
            + o.completion_tokens * price.output
        )
        record = LedgerRecord(
            request_id=a.request.request_id,
            client_request_id=a.inference.client_request_id,
            session_id=a.inference.session_id,
            session_slo_ms=a.inference.session_slo_ms,
            tenant=a.caller.tenant,
            team=a.caller.team,
            user=a.caller.user,
            key_id=a.caller.key_id,
            model_requested=a.inference.model,
            model_served=o.model_served,
            adapter=a.inference.adapter.id if a.inference.adapter is not None else None,
            pool=o.pool,
            endpoint=o.endpoint,
            status=o.status,
            http_status=o.http_status,
            prompt_tokens=o.prompt_tokens,
            completion_tokens=o.completion_tokens,
            cached_tokens=o.cached_tokens,
            cost_usd=cost,
            gpu_seconds=o.gpu_seconds,
            gpu_cost_usd=o.gpu_cost_usd,
            ttft_s=o.ttft_s,
            route_step=o.route_step,
            attempts=o.attempts,
            e2e_s=time.perf_counter() - a.started,
            started_at=a.started_wall,
            ended_at=time.time(),
            ingress=self._replica,
        )
        settle = SettleRequest(
            admit=a.request,
            result=a.result,
            used_tokens=o.prompt_tokens + o.completion_tokens,
            used_usd=cost,
            record=record,
            key_id=a.caller.key_id,
        )
        started = time.perf_counter()
        shared = settle
        if a.local and self._local is not None:
            try:  # release the local reservation; the shared store keeps the record
                await self._local.settle(settle)
            except Exception as exc:
                log.warning("local settlement of %s failed: %r", record.request_id, exc)
            # bill the shared budgets: nothing was reserved there, so nothing to refund
            shared = replace(settle, result=replace(a.result, reserved_tokens=settle.used_tokens))
        try:
            await asyncio.wait_for(self._store.settle(shared), self._options.store_timeout_s)
        except Exception as exc:
            self.store_failures += 1
            self._on_failure("settle")
            await self._resender.add(shared, exc)
        else:
            self._resender.store_answered()
        self._observe("settle", time.perf_counter() - started)
        self._on_settled(record)

    @property
    def live(self) -> int:
        """Admitted requests not settled yet."""
        return len(self._live)

    @property
    def pending(self) -> int:
        """Settlements journaled and not yet written to the store."""
        return len(self.journal)

    async def drain(self, deadline_s: float = DRAIN_DEADLINE_S) -> None:
        """Wait for settlements in flight (shutdown, tests), then try to write the
        journal to the store for up to ``deadline_s`` (``Resender.drain``)."""
        while self._settling:
            await asyncio.gather(*list(self._settling), return_exceptions=True)
        await self._resender.drain(deadline_s)

    async def close(self) -> None:
        """Stop the heartbeat and let go of the journal file (after ``drain``); an empty
        journal deletes it."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        await self._resender.close()

    # ---- reservation heartbeat -----------------------------------------------------

    # Rule: the heartbeat starts with the gate's first admit (a Gate may be built outside
    # an event loop) and then beats every ttl/3 for the gate's life, live requests or
    # not: it refreshes this replica's live reservations and sweeps the store for lost
    # requests (``StateStore.sweep_lost``: any replica's, e.g. a killed predecessor's). A
    # sweep runs when the heartbeat starts and then at most every ttl/3; it waits while
    # this replica's journal holds settlements (their reservations may have expired
    # during the outage: the re-send must come first); a failed sweep is logged at
    # WARNING and counted nowhere else.
    _swept_at = float("-inf")  # monotonic time of the last sweep

    def _ensure_heartbeat(self) -> None:
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        ttl = self._options.reservation_ttl_s
        while True:
            if time.monotonic() - self._swept_at >= ttl / 3 and not self.pending:
                self._swept_at = time.monotonic()
                try:  # asyncio.timeout, not wait_for: 3.11's may swallow a cancel
                    async with asyncio.timeout(ttl / 3):
                        lost = await self._store.sweep_lost()
                except Exception as exc:
                    log.warning("sweep for lost requests failed: %r", exc)
                else:
                    self._resender.store_answered()
                    if lost:
                        log.warning("%d lost requests recorded (a replica vanished)", lost)
            await asyncio.sleep(ttl / 3)
            shared = [
                a.request
                for a in self._live.values()
                if not a.local and (a.request.concurrency or a.request.budgets)
            ]
            with contextlib.suppress(Exception):
                if shared:
                    await self._store.refresh(shared, ttl)
                    self._resender.store_answered()
