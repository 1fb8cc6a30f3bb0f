"""The shared-state store behind layer 1 (keys, tenants, limits, budgets, ledger).

Rule: ``admit`` and ``settle`` are each ONE atomic step on the store — a Lua script
in Redis, one ``BEGIN IMMEDIATE`` transaction in SQLite — so every ingress replica
that shares a store shares the limits exactly (limits are never read from local
memory and then written back, the failure that multiplies a limit by the replica
count).

Parameters, all carried by the request, none held by the store:
- rate buckets: capacity ``limit`` units, refilled continuously at ``limit / 60``
  units per second (token bucket; a request costs 1 request unit and ``prompt +
  allowance`` token units; settlement refunds unused token units, capped at capacity);
- concurrency: at most ``limit`` live reservations, each expiring ``ttl_s`` after
  admission (or after the last ``refresh``) so a crashed replica frees its slots;
- budgets: ``used + reserved + this request <= limit`` for every budget that applies;
  the output allowance is ``min(requested, (limit - used - reserved - prompt cost)
  / output price)`` over all budgets; below ``min(min_output_tokens, requested)``
  the request is refused before it reaches an engine. Reservations expire like
  concurrency slots.
- clock: the store's own (Redis ``TIME``; the process clock for SQLite, which serves
  one node), so replicas never disagree about bucket refills.

Lost requests (admitted = recorded, across crashes). An admit that holds something in
the store (a concurrency slot or a budget hold) and carries ``AdmitRequest.pending``
also stores that record, expiring with the reservation; ``refresh`` extends it with
the holds and ``settle`` deletes it in its own atomic step. When the expiry passes
without a settlement (the replica was killed), ``sweep_lost`` — any replica may run
it — writes the record with status ``lost`` (``lost_record``: ``ended_at`` = the expiry,
``e2e_s`` = expiry - ``started_at``), bills its usage (prompt + completion tokens,
``cost_usd``: what the gateway put in it, the reserved prompt tokens) to the token and
usd budgets the admit named, and releases its slots and holds, all in one atomic step
per tenant. Sweep and settle share the settled marker, so a request ends with exactly
one record whichever runs first. A settle after the sweep (the replica lived, but could
not reach the store for longer than the reservation's TTL, and its journal delivered the
settlement later) replaces the ``lost`` record with its own and bills the difference
between its usage and what the sweep billed; any other record already written stays,
and settling it again returns False and bills nothing. Rate buckets are not refunded
(the bucket refilled while the reservation aged). Requests without slot or hold (rate
limits only, or no limits at all) are not tracked: their crash leaves no record. The
pending record's tenant is the tenant of the record ``settle`` writes (Redis keeps both
under that tenant's hash tag).

Agent sessions (``app.sessions``). A session is (tenant, session id): the same id under
two tenants is two sessions. The store keeps, per session, when it was last active (a
call admitted: ``session_call``; a record settled), whether it is still open (until
``close_idle_sessions`` claims it — one caller gets each session, so its metrics are
observed once), and a cancellation mark that expires at a given time; its ledger records
are found through a per-tenant session index written in the same atomic step as each
record. ``cancel_session`` also appends (tenant, session) to the cancel feed that every
ingress replica follows (``session_cancels``: a Redis stream, an SQLite table) from the
cursor it last read, so a replica that missed a moment (a reconnect) still sees every
cancellation.

Stored responses (``app.responses``). A response is (tenant, response id), stored as one
opaque JSON value that expires ``ttl_s`` after it was written (Redis ``SET EX``; an
SQLite row with its expiry, read only while unexpired and deleted by later writes);
another tenant's id reads as absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from app.state.records import (
    AdapterRecord,
    KeyRecord,
    LedgerRecord,
    LimitsRecord,
    Principal,
    TenantRecord,
)

RateKind = Literal["requests", "tokens"]
BudgetUnit = Literal["tokens", "usd"]
RejectReason = Literal["requests", "tokens", "concurrency", "budget"]


class StoreUnavailable(Exception):
    """The store could not be reached or did not answer in time."""


@dataclass(frozen=True)
class RateCheck:
    """One token bucket: ``key`` names it, e.g. ``rate:key:ab12cd:requests``."""

    key: str
    kind: RateKind
    limit: int  # units per minute = bucket capacity


@dataclass(frozen=True)
class ConcurrencyCheck:
    key: str
    limit: int


@dataclass(frozen=True)
class BudgetCheck:
    """One budget counter for one period, e.g. ``budget:tenant:acme:tokens:d:2026-11-29``."""

    key: str
    unit: BudgetUnit
    limit: float  # tokens, or US dollars
    expires_at: float  # epoch seconds after which the store may forget the counter


@dataclass(frozen=True)
class Price:
    """US dollars per token (a price "per 1M tokens" divided by 1e6)."""

    input: float = 0.0
    output: float = 0.0
    cached_input: float = 0.0


@dataclass(frozen=True)
class AdmitRequest:
    request_id: str
    rates: tuple[RateCheck, ...] = ()
    concurrency: tuple[ConcurrencyCheck, ...] = ()
    budgets: tuple[BudgetCheck, ...] = ()
    prompt_tokens: int = 0
    max_output_tokens: int = 0  # what the client asked for (or the context's remainder)
    min_output_tokens: int = 1
    price: Price = Price()
    ttl_s: float = 60.0
    # The record the store writes if this request is lost (module docstring); kept only
    # when the request holds a slot or a budget. Not compared (a record is unhashable).
    pending: LedgerRecord | None = field(default=None, compare=False)

    @property
    def tracked(self) -> bool:
        """Whether the store keeps ``pending`` for this request."""
        return self.pending is not None and bool(self.concurrency or self.budgets)


@dataclass(frozen=True)
class RateState:
    """A bucket after the decision, for the ``x-ratelimit-*`` headers."""

    kind: RateKind
    limit: int
    remaining: int
    reset_s: float  # seconds until the bucket is full again


@dataclass(frozen=True)
class AdmitResult:
    admitted: bool
    allowance: int = 0  # output tokens the request may produce (the new max_tokens)
    reserved_tokens: int = 0  # prompt + allowance, held in token budgets and buckets
    reserved_usd: float = 0.0  # prompt cost + allowance × output price
    reason: RejectReason | None = None
    scope_key: str | None = None  # the check that refused (never shown to clients)
    retry_after_s: float = 0.0
    rates: tuple[RateState, ...] = ()


@dataclass(frozen=True)
class SettleRequest:
    """Replace the reservation of ``admit`` by actual usage and write the ledger record.

    ``used_tokens`` = prompt + completion tokens actually processed (0 when the request
    never reached an engine), ``used_usd`` their cost. Settling a request id twice
    changes nothing the second time (returns False) — unless the first record is the
    sweep's ``lost`` one, which this one replaces (module docstring)."""

    admit: AdmitRequest
    result: AdmitResult
    used_tokens: int
    used_usd: float
    record: LedgerRecord
    key_id: str | None = None  # its last-used time is set to the record's end time


def gateway_request_id(value: str) -> str:
    """A response's id (``chatcmpl-<id>``, ``cmpl-<id>``) or ``x-request-id`` → the id
    the ledger keeps."""
    for prefix in ("chatcmpl-", "cmpl-"):
        if value.startswith(prefix):
            return value[len(prefix) :]
    return value


def lost_record(pending: LedgerRecord, expired_at: float) -> LedgerRecord:
    """The ledger record ``sweep_lost`` writes for a pending record whose reservation
    expired at ``expired_at`` (the store's clock)."""
    return pending.model_copy(
        update={
            "status": "lost",
            "ended_at": expired_at,
            "e2e_s": max(0.0, expired_at - pending.started_at),
        }
    )


@dataclass(frozen=True)
class LedgerQuery:
    tenant: str | None = None
    since: float | None = None  # epoch seconds, inclusive
    until: float | None = None  # epoch seconds, exclusive
    limit: int | None = None  # newest first when set
    request_id: str | None = None  # the one record of this request id (the gateway's id)
    session_id: str | None = None  # the records of this session (needs ``tenant``)

    def __post_init__(self) -> None:
        if self.session_id is not None and self.tenant is None:
            raise ValueError("a session's records are found within one tenant")


@dataclass(frozen=True)
class SessionKey:
    tenant: str
    session_id: str


@dataclass(frozen=True)
class SessionState:
    """What the store knows of one session beyond its ledger records."""

    known: bool  # a call was admitted, a record written or a cancellation made
    open: bool = False  # active and not yet claimed by ``close_idle_sessions``
    last_at: float | None = None  # epoch seconds of its last admission or settlement
    cancelled_until: float | None = None  # epoch seconds; None: not cancelled


class StateStore(Protocol):
    """Every method may raise ``StoreUnavailable``."""

    url: str

    async def ping(self) -> None: ...

    async def close(self) -> None: ...

    # identity records --------------------------------------------------------------
    async def put_key(self, record: KeyRecord) -> None: ...

    async def get_key(self, key_id: str) -> KeyRecord | None: ...

    async def list_keys(self, tenant: str | None = None) -> list[KeyRecord]: ...

    async def put_tenant(self, record: TenantRecord) -> None: ...

    async def get_tenant(self, tenant: str) -> TenantRecord | None: ...

    async def list_tenants(self) -> list[TenantRecord]: ...

    async def put_adapter(self, record: AdapterRecord) -> None: ...

    async def get_adapter(self, adapter_id: str) -> AdapterRecord | None: ...

    async def list_adapters(self) -> list[AdapterRecord]: ...

    async def delete_adapter(self, adapter_id: str) -> bool:
        """Remove a registered adapter; False when there was none."""
        ...

    async def put_limits(self, record: LimitsRecord) -> None: ...

    async def list_limits(self) -> list[LimitsRecord]: ...

    async def load_principal(
        self,
        *,
        key_id: str | None = None,
        tenant: str | None = None,
        team: str | None = None,
        user: str | None = None,
    ) -> Principal:
        """In one round trip: the key (when ``key_id``; its tenant/team/user then win
        over the arguments), the tenant record, and the team and user limits."""
        ...

    # admission -------------------------------------------------------------------------
    async def admit(self, request: AdmitRequest) -> AdmitResult: ...

    async def refresh(self, admits: Sequence[AdmitRequest], ttl_s: float) -> None:
        """Extend the reservations (concurrency slots, budget holds) of live requests."""
        ...

    async def settle(self, request: SettleRequest) -> bool: ...

    async def sweep_lost(self, limit: int = 100) -> int:
        """Write the ``lost`` record of up to ``limit`` pending requests whose reservation
        expired unsettled, bill them, release their slots and holds (module docstring);
        returns how many records it wrote."""
        ...

    # ledger ------------------------------------------------------------------------------
    async def query_ledger(self, query: LedgerQuery) -> list[LedgerRecord]: ...

    async def budget_used(self, key: str) -> tuple[float, float]:
        """(used, reserved) of one budget counter — for operators and tests."""
        ...

    # sessions (module docstring) -------------------------------------------------------
    async def session_call(self, tenant: str, session_id: str, at: float) -> float | None:
        """A call of the session is being admitted at ``at`` (epoch seconds): the session
        is active (and open again if it was closed). Returns the end of its cancellation
        when it is cancelled (the caller refuses the call), else None."""
        ...

    async def session_state(self, tenant: str, session_id: str) -> SessionState: ...

    async def cancel_session(self, tenant: str, session_id: str, until: float) -> bool:
        """Mark a known session cancelled until ``until`` and append it to the cancel
        feed; an unknown session is left alone (returns False)."""
        ...

    async def session_cancels(
        self, cursor: str | None, wait_s: float
    ) -> tuple[list[SessionKey], str]:
        """The cancellations after ``cursor`` (waiting up to ``wait_s`` for one) and the
        cursor to read from next; ``cursor`` None: none, only the feed's current end."""
        ...

    async def close_idle_sessions(self, before: float, limit: int = 100) -> list[SessionKey]:
        """Claim up to ``limit`` open sessions per tenant last active before ``before``:
        each is returned to exactly one caller and is closed from then on."""
        ...

    # stored responses (the Responses API, ``app.responses``) ---------------------------
    async def put_response(self, tenant: str, response_id: str, data: str, ttl_s: float) -> None:
        """Store (or replace) the tenant's response ``data`` (opaque JSON) for ``ttl_s``."""
        ...

    async def get_response(self, tenant: str, response_id: str) -> str | None:
        """The tenant's stored response, or None (never stored, expired, deleted, or
        another tenant's)."""
        ...

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        """Delete the tenant's stored response; False when it had none by that id."""
        ...
