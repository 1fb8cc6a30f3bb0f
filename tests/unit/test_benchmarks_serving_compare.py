"""benchmarks.serving_compare: the report's figures from app.bench records, and the
conversion of records stored by the former httpx generator. Hand-computed cases."""

from __future__ import annotations

from typing import Any

import pytest

from app.bench.records import RequestRecord
from benchmarks.serving_lib import figures, stored_record


def _old(
    index: int, chunks: list[float], e2e: float | None, error: str | None = None
) -> dict[str, Any]:
    """A record as the former generator wrote it (absolute starts, relative chunk times)."""
    return {
        "index": index,
        "intended_start": 100.0 + index,
        "actual_start": 100.0 + index + 0.002,
        "ttft": chunks[0] if chunks else None,
        "e2e": e2e,
        "chunk_times": chunks,
        "output_tokens": len(chunks) or None,
        "prompt_tokens": 64,
        "error": error,
        "n_chunks": len(chunks),
    }


def test_an_old_record_converts_field_by_field() -> None:
    r = stored_record(_old(3, [0.1, 0.15, 0.25], 0.3))
    assert (r.index, r.intended, r.sent, r.chunks, r.end) == (
        3,
        103.0,
        103.002,
        [0.1, 0.15, 0.25],
        0.3,
    )
    assert r.ok and r.status == 200 and r.ttft == 0.1 and r.e2e == 0.3
    assert r.lag == pytest.approx(0.002)
    assert (r.prompt_tokens, r.output_tokens, r.input_tokens, r.max_tokens) == (64, 3, 64, 32)


@pytest.mark.parametrize(
    ("error", "kind", "status"),
    [
        ("HTTP 503: busy", "http_5xx", 503),
        ("HTTP 429: slow down", "http_429", 429),
        ("HTTP 404: no model", "http_4xx", 404),
        ('stream error: {"message": "x"}', "stream_error", None),
        ("ReadTimeout: timed out", "stream_error", None),
    ],
)
def test_an_old_failed_record_keeps_its_message_and_has_no_end(
    error: str, kind: str, status: int | None
) -> None:
    r = stored_record(_old(0, [0.1], 0.2, error))
    assert (r.error_kind, r.status, r.error, r.end) == (kind, status, error, None)
    assert not r.ok and r.ttft is None


def test_new_records_round_trip() -> None:
    r = stored_record(_old(1, [0.1, 0.2], 0.2))
    assert stored_record(r.to_json()) == r


def _rec(intended: float, chunks: list[float], end: float) -> RequestRecord:
    r = RequestRecord(0, "fixed", "chat", intended=intended, sent=intended)
    r.chunks, r.end, r.output_tokens = chunks, end, len(chunks)
    return r


def test_figures_hand_computed() -> None:
    a = _rec(0.0, [0.1, 0.2, 0.3], 0.3)  # ITL .1 .1; TPOT .1
    b = _rec(1.0, [0.2, 0.2005, 0.5], 0.5)  # ITL .0005 (bunched) .2995; TPOT .15
    bad = stored_record(_old(0, [], None, "HTTP 500: x"))
    bad.intended = bad.sent = 2.0
    f: dict[str, Any] = figures([a, b, bad])
    assert (f["requests"], f["ok"], f["errors"]) == (3, 2, 1)
    assert f["error_kinds"] == {"http_5xx": 1}
    assert f["ttft_p50"] == pytest.approx(0.15)
    assert f["tpot_p50"] == pytest.approx(0.125)
    assert f["itl_bunched_frac"] == pytest.approx(1 / 4)
    assert f["e2e_p50"] == pytest.approx(0.4)
    assert f["chunks_per_token"] == pytest.approx(1.0) and f["output_tokens"] == 6
    # summarize's duration: first intended start 0.0 to the failure's send at 2.0
    assert f["output_tok_per_s"] == pytest.approx(6 / 2.0)
    assert f["send_lateness_p99"] == pytest.approx(0.0)


def test_figures_of_nothing_have_no_rates() -> None:
    f = figures([])
    assert f["requests"] == 0 and f["itl_bunched_frac"] is None
    assert f["output_tok_per_s"] is None and f["req_per_s"] is None
