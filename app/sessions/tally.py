"""A session's tally, derived from its ledger records (the one outcome of each call).

Rule: calls = records; tokens and cost = their sums; the session's wall time runs from
the earliest call's start to the latest call's end; its SLO is the last record's
``session_slo_ms`` (the request header), else the tenant's (``gateway.sessions``). The
SLO verdict: ``missed`` as soon as the wall time exceeds the SLO, ``met`` once the
session has ended (closed after ``idle_s``) within it, ``pending`` while it is open
within it, ``cancelled`` for a cancelled session that had not missed it, ``none``
without an SLO.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from app.schema import Strict
from app.state.protocol import SessionState
from app.state.records import LedgerRecord

SloVerdict = Literal["met", "missed", "pending", "cancelled", "none"]


@dataclass(frozen=True)
class SessionTally:
    id: str
    calls: int
    statuses: dict[str, int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cost_usd: float
    started_at: float | None
    ended_at: float | None
    slo_ms: float | None
    state: SessionState

    @property
    def wall_s(self) -> float:
        if self.started_at is None or self.ended_at is None:
            return 0.0
        return max(0.0, self.ended_at - self.started_at)

    @property
    def cancelled(self) -> bool:
        return self.state.cancelled_until is not None or "cancelled" in self.statuses

    @property
    def slo(self) -> SloVerdict:
        if self.slo_ms is None:
            return "none"
        if self.wall_s * 1000.0 > self.slo_ms:
            return "missed"
        if self.cancelled:
            return "cancelled"
        return "pending" if self.state.open else "met"

    def view(self) -> Session:
        return Session(
            id=self.id,
            status="cancelled" if self.cancelled else "open" if self.state.open else "ended",
            calls=self.calls,
            calls_by_status=dict(sorted(self.statuses.items())),
            usage=SessionUsage(
                prompt_tokens=self.prompt_tokens,
                completion_tokens=self.completion_tokens,
                total_tokens=self.prompt_tokens + self.completion_tokens,
                prompt_tokens_details=CachedTokens(cached_tokens=self.cached_tokens),
            ),
            cost_usd=round(self.cost_usd, 12),
            started_at=self.started_at,
            ended_at=self.ended_at,
            wall_time_s=round(self.wall_s, 6),
            last_active_at=self.state.last_at,
            slo=SessionSlo(target_ms=self.slo_ms, verdict=self.slo),
            cancelled_until=self.state.cancelled_until,
        )

    def to_json(self) -> dict[str, Any]:
        """The body of ``GET /v1/sessions/{id}`` (``Session``)."""
        return self.view().model_dump()


class CachedTokens(Strict):
    cached_tokens: int


class SessionUsage(Strict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: CachedTokens


class SessionSlo(Strict):
    target_ms: float | None
    verdict: SloVerdict


class Session(Strict):
    """``GET /v1/sessions/{id}`` and the answer of its cancel."""

    id: str
    object: Literal["session"] = "session"
    status: Literal["open", "ended", "cancelled"]
    calls: int
    calls_by_status: dict[str, int]
    usage: SessionUsage
    cost_usd: float
    started_at: float | None
    ended_at: float | None
    wall_time_s: float
    last_active_at: float | None
    slo: SessionSlo
    cancelled_until: float | None


def tally(
    session_id: str,
    records: Sequence[LedgerRecord],
    state: SessionState,
    default_slo_ms: float | None,
) -> SessionTally:
    """The tally of one session's records (module docstring)."""
    ordered = sorted(records, key=lambda r: r.ended_at)
    slos = [r.session_slo_ms for r in ordered if r.session_slo_ms is not None]
    return SessionTally(
        id=session_id,
        calls=len(records),
        statuses=dict(Counter(r.status for r in records)),
        prompt_tokens=sum(r.prompt_tokens for r in records),
        completion_tokens=sum(r.completion_tokens for r in records),
        cached_tokens=sum(r.cached_tokens for r in records),
        cost_usd=sum(r.cost_usd for r in records),
        started_at=min((r.started_at for r in records), default=None),
        ended_at=max((r.ended_at for r in records), default=None),
        slo_ms=slos[-1] if slos else default_slo_ms,
        state=state,
    )
