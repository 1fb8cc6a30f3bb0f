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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from app.config import GatewayArgs
from app.gateway.plan import Caller, Plan
from app.state.protocol import (
    AdmitRequest,
    AdmitResult,
    Price,
    RateState,
    SettleRequest,
    StateStore,
    StoreUnavailable,
)
from app.state.records import LedgerRecord, LedgerStatus
from app.state.sqlite_store import SqliteStore

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class Outcome:
    """How an admitted request ended, as the ingress saw it."""

    endpoint: str
    status: LedgerStatus
    http_status: int
    model_served: str | None = None
    pool: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float | None = None
    route_step: str | None = None
    attempts: int = 0


@dataclass
class Admission:
    caller: Caller
    request: AdmitRequest
    result: AdmitResult
    model_requested: str
    requested_max_tokens: int | None
    session_id: str | None
    client_request_id: str | None = None
    local: bool = False  # admitted by the fail-open local store
    started_wall: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)

    @property
    def max_tokens(self) -> int | None:
        """The max_tokens to send to the engine: the allowance when a budget capped it."""
        if not self.request.budgets:
            return self.requested_max_tokens
        return self.result.allowance

    @property
    def capped(self) -> bool:
        return self.request.budgets != () and (
            self.requested_max_tokens is None or self.result.allowance < self.requested_max_tokens
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
    ) -> None:
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

    # ---- admission -----------------------------------------------------------------

    async def admit(
        self,
        caller: Caller,
        plan: Plan,
        *,
        model: str,
        prompt_tokens: int,
        requested_max_tokens: int | None,
        context_left: int,
        price: Price,
        session_id: str | None = None,
        request_id: str | None = None,
        client_request_id: str | None = None,
    ) -> Admission:
        """``request_id`` is the gateway's id (unique per request): the store's key for
        the reservation and the ledger record's id."""
        want = context_left if requested_max_tokens is None else requested_max_tokens
        rid = request_id or uuid.uuid4().hex
        request = AdmitRequest(
            request_id=rid,
            rates=plan.rates,
            concurrency=plan.concurrency,
            budgets=plan.budgets,
            prompt_tokens=prompt_tokens,
            max_output_tokens=max(0, want),
            min_output_tokens=self._options.min_output_tokens,
            price=price,
            ttl_s=self._options.reservation_ttl_s,
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
            self._observe("admit", time.perf_counter() - started)
        if not result.admitted:
            assert result.reason is not None
            headers = rate_headers(result.rates)
            if result.retry_after_s > 0:
                headers["Retry-After"] = str(max(1, round(result.retry_after_s)))
            raise Refused(result.reason, result.retry_after_s, headers)
        admission = Admission(
            caller,
            request,
            result,
            model,
            requested_max_tokens,
            session_id,
            client_request_id=client_request_id,
            local=local,
        )
        self._live[request.request_id] = admission
        self._ensure_heartbeat()
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

    def settle(self, admission: Admission, outcome: Outcome) -> None:
        """Settle in the background: a cancelled handler cannot interrupt it."""
        if self._live.pop(admission.request.request_id, None) is None:
            return  # settled already
        task = asyncio.get_running_loop().create_task(self._settle(admission, outcome))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

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
            client_request_id=a.client_request_id,
            session_id=a.session_id,
            tenant=a.caller.tenant,
            team=a.caller.team,
            user=a.caller.user,
            key_id=a.caller.key_id,
            model_requested=a.model_requested,
            model_served=o.model_served,
            pool=o.pool,
            endpoint=o.endpoint,
            status=o.status,
            http_status=o.http_status,
            prompt_tokens=o.prompt_tokens,
            completion_tokens=o.completion_tokens,
            cached_tokens=o.cached_tokens,
            cost_usd=cost,
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
        try:
            store: StateStore = self._local if a.local and self._local else self._store
            await store.settle(settle)
            if a.local:  # bill the shared budgets and keep the record; nothing to refund
                no_refund = replace(a.result, reserved_tokens=settle.used_tokens)
                await self._store.settle(replace(settle, result=no_refund))
        except Exception as exc:
            self.store_failures += 1
            self._on_failure("settle")
            log.error("ledger record not stored (%r): %s", exc, record.model_dump_json())
        self._observe("settle", time.perf_counter() - started)
        self._on_settled(record)

    @property
    def live(self) -> int:
        """Admitted requests not settled yet."""
        return len(self._live)

    async def drain(self) -> None:
        """Wait for settlements in flight (shutdown, tests)."""
        while self._settling:
            await asyncio.gather(*list(self._settling), return_exceptions=True)

    # ---- reservation heartbeat -----------------------------------------------------

    def _ensure_heartbeat(self) -> None:
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        ttl = self._options.reservation_ttl_s
        while self._live:
            await asyncio.sleep(ttl / 3)
            shared = [
                a.request
                for a in self._live.values()
                if not a.local and (a.request.concurrency or a.request.budgets)
            ]
            with contextlib.suppress(Exception):
                if shared:
                    await self._store.refresh(shared, ttl)
