"""A session's tally from its ledger records: sums, wall time, SLO source and verdict."""

from __future__ import annotations

import pytest

from app.sessions.tally import tally
from app.state.protocol import SessionState
from app.state.records import LedgerRecord, LedgerStatus

OPEN = SessionState(known=True, open=True, last_at=20.0)
ENDED = SessionState(known=True, open=False, last_at=20.0)
CANCELLED = SessionState(known=True, open=True, last_at=20.0, cancelled_until=99.0)


def rec(
    start: float,
    end: float,
    *,
    status: LedgerStatus = "ok",
    slo: float | None = None,
    prompt: int = 10,
    completion: int = 5,
) -> LedgerRecord:
    return LedgerRecord(
        request_id=f"r{start}",
        session_id="s",
        session_slo_ms=slo,
        tenant="acme",
        model_requested="m",
        endpoint="chat",
        status=status,
        http_status=200,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=2,
        cost_usd=0.25,
        e2e_s=end - start,
        started_at=start,
        ended_at=end,
    )


def test_sums_and_wall_time_over_the_calls() -> None:
    t = tally("s", [rec(12.0, 14.0), rec(10.0, 11.5, status="error", completion=0)], OPEN, None)
    assert (t.calls, t.prompt_tokens, t.completion_tokens, t.cached_tokens) == (2, 20, 5, 4)
    assert t.cost_usd == pytest.approx(0.5)
    assert (t.started_at, t.ended_at, t.wall_s) == (10.0, 14.0, 4.0)
    assert t.statuses == {"ok": 1, "error": 1}
    body = t.to_json()
    assert body["usage"] == {
        "prompt_tokens": 20,
        "completion_tokens": 5,
        "total_tokens": 25,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert (body["object"], body["status"], body["calls"]) == ("session", "open", 2)


def test_no_records_yet() -> None:
    t = tally("s", [], OPEN, 100.0)
    assert (t.calls, t.wall_s, t.started_at, t.slo) == (0, 0.0, None, "pending")


@pytest.mark.parametrize(
    ("records", "state", "default", "slo_ms", "verdict"),
    [
        ([rec(0, 1)], OPEN, None, None, "none"),
        ([rec(0, 1)], OPEN, 2000.0, 2000.0, "pending"),  # within, still open
        ([rec(0, 1)], ENDED, 2000.0, 2000.0, "met"),
        ([rec(0, 3)], OPEN, 2000.0, 2000.0, "missed"),  # missed as soon as it is over
        ([rec(0, 1, slo=500.0)], ENDED, 2000.0, 500.0, "missed"),  # the header wins
        ([rec(0, 1, slo=500.0), rec(1, 2, slo=5000.0)], ENDED, None, 5000.0, "met"),  # last
        ([rec(0, 1, slo=5000.0), rec(1, 2)], ENDED, None, 5000.0, "met"),  # last one set
        ([rec(0, 1, status="cancelled")], ENDED, 2000.0, 2000.0, "cancelled"),
        ([rec(0, 1)], CANCELLED, 2000.0, 2000.0, "cancelled"),
        ([rec(0, 3, status="cancelled")], ENDED, 2000.0, 2000.0, "missed"),
    ],
)
def test_slo_verdict(
    records: list[LedgerRecord],
    state: SessionState,
    default: float | None,
    slo_ms: float | None,
    verdict: str,
) -> None:
    t = tally("s", records, state, default)
    assert (t.slo_ms, t.slo) == (slo_ms, verdict)
    assert t.to_json()["slo"] == {"target_ms": slo_ms, "verdict": verdict}
