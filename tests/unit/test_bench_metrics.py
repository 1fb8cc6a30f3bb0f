"""app.bench.metrics: percentiles, TTFT/TPOT/ITL/E2E, goodput and sessions against
hand-computed cases."""

from __future__ import annotations

import pytest

from app.bench.metrics import SLO, describe, duration, percentile, sessions, summarize
from app.bench.records import RequestRecord


def _rec(
    intended: float,
    chunks: list[float],
    end: float | None,
    tokens: int | None = None,
    *,
    error: str | None = None,
    kind: str = "fixed",
    session: int | None = None,
    prompt: int = 10,
) -> RequestRecord:
    r = RequestRecord(index=0, kind=kind, endpoint="chat", intended=intended, sent=intended)
    r.chunks, r.end, r.output_tokens, r.prompt_tokens = chunks, end, tokens, prompt
    r.opened, r.session = True, session
    if error is not None:
        r.error_kind, r.end = error, None  # type: ignore[assignment]
    return r


A = _rec(0.0, [0.1, 0.15, 0.25], 0.3, 3)  # ttft .1, itl .05 .10, tpot (.3-.1)/2 = .1
B = _rec(1.0, [0.2], 0.2, 1)  # one token: no TPOT (0 for goodput)
C = _rec(2.0, [], None, error="http_429")
D = _rec(3.0, [0.05, 0.1, 0.15, 0.2, 0.25], 0.25, 5)  # tpot .05


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([4.0, 1.0, 3.0, 2.0], 99, 3.97),
        ([0.05, 0.1, 0.2], 90, 0.18),
        ([5.0], 99.9, 5.0),
        ([1.0, 2.0], 0, 1.0),
        ([1.0, 2.0], 100, 2.0),
    ],
)
def test_percentile_interpolates_linearly(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 50) is None


def test_describe_has_mean_population_std_and_the_five_percentiles() -> None:
    d = describe([1.0, 2.0, 3.0, 4.0])
    assert d["count"] == 4 and d["mean"] == 2.5 and d["max"] == 4.0
    assert d["std"] == pytest.approx(1.118033988749895)  # population std, numpy's default
    assert set(d) >= {"p50", "p90", "p95", "p99", "p99.9"}


def test_per_request_definitions() -> None:
    assert (A.ttft, A.e2e, A.tpot) == (0.1, 0.3, pytest.approx(0.1))
    assert A.itls() == pytest.approx([0.05, 0.10])
    assert B.tpot is None and B.itls() == []
    assert not C.ok and C.ttft is None and C.e2e is None


def test_output_tokens_fall_back_to_content_chunks_without_usage() -> None:
    r = _rec(0.0, [0.1, 0.2, 0.3], 0.3, None)
    assert r.n_output == 3 and r.tpot == pytest.approx(0.1)


def test_summary_of_hand_computed_run() -> None:
    slo = SLO(ttft_s=0.15, tpot_s=0.08)
    s = summarize([A, B, C, D], slo)
    assert s["duration_s"] == pytest.approx(3.25)  # first intended 0 → D ends at 3.25
    assert (s["requests"], s["completed"], s["failed"]) == (4, 3, 1)
    assert s["errors"]["http_429"] == 1 and s["error_rate"] == 0.25
    # only D meets both SLOs: A's TPOT is .1 > .08, B's TTFT .2 > .15
    assert s["good_requests"] == 1
    assert s["goodput"] == pytest.approx(1 / 3.25)
    assert s["request_throughput"] == pytest.approx(3 / 3.25)
    assert s["total_output_tokens"] == 9
    assert s["output_throughput"] == pytest.approx(9 / 3.25)
    assert s["total_token_throughput"] == pytest.approx((9 + 30) / 3.25)
    assert s["ttft_s"]["p50"] == pytest.approx(0.1)
    assert s["tpot_s"]["mean"] == pytest.approx(0.075)  # B has no TPOT
    assert s["itl_s"]["count"] == 6
    assert s["e2e_s"]["max"] == pytest.approx(0.3)


def test_goodput_counts_a_one_token_request_as_tpot_zero() -> None:
    s = summarize([B], SLO(tpot_s=0.001), duration_s=2.0)
    assert s["good_requests"] == 1 and s["goodput"] == 0.5


@pytest.mark.parametrize("slo", [None, SLO(), SLO(max_error_rate=0.5)])
def test_goodput_is_none_without_a_latency_slo(slo: SLO | None) -> None:
    assert summarize([A], slo)["goodput"] is None


def test_duration_counts_unfinished_requests_up_to_their_send() -> None:
    assert duration([C]) == pytest.approx(0.0)
    assert duration([A, C]) == pytest.approx(2.0)


def test_cache_hit_rate_is_cached_over_prompt_tokens() -> None:
    a, d = _rec(0.0, [0.1], 0.1, 1, prompt=100), _rec(0.0, [0.1], 0.1, 1, prompt=300)
    a.cached_tokens, d.cached_tokens = 50, 150
    assert summarize([a, d])["cache_hit_rate"] == pytest.approx(0.5)


def test_both_naming_conventions_are_reported() -> None:
    naming = summarize([A])["naming"]
    assert naming["vllm"]["ITL"] == "itl" and naming["guidellm_aiperf"]["ITL"] == "tpot"


def test_sessions_observe_tail_amplification() -> None:
    records = []
    # 20 sessions x 3 calls; session 0's generate call is the slowest of its step
    for s in range(20):
        t = 10.0 * s
        records.append(_rec(t, [0.1], 0.2, 1, kind="planner", session=s))
        records.append(_rec(t + 0.2, [0.01], 0.05, 1, kind="embed", session=s))
        slow = 5.0 if s == 0 else 1.0 + s * 0.01
        records.append(_rec(t + 0.25, [0.1], slow, 8, kind="generate_1", session=s))
    out = sessions(records)
    assert out is not None
    assert out["sessions"] == 20 and out["completed"] == 20
    assert out["predicted_tail_fraction"] == pytest.approx(1 - 0.95**3)
    # planner/embed calls all tie (nobody above p95); generate: only session 0 above its p95
    assert out["observed_tail_fraction"] == pytest.approx(1 / 20)
    assert out["session_e2e_s"]["max"] == pytest.approx(0.25 + 5.0)


def test_a_failed_call_fails_its_session_and_counts_as_tail() -> None:
    records = [
        _rec(0.0, [0.1], 0.2, 1, kind="planner", session=0),
        _rec(0.2, [], None, error="http_5xx", kind="embed", session=0),
        _rec(5.0, [0.1], 0.2, 1, kind="planner", session=1),
    ]
    out = sessions(records)
    assert out is not None
    assert out["completed"] == 1 and out["observed_tail_fraction"] == 0.5


def test_no_sessions_gives_none() -> None:
    assert sessions([A, B]) is None


def test_tpot_uses_usage_tokens_when_chunks_carry_several() -> None:
    r = _rec(0.0, [0.1, 0.5], 0.5, 5)  # 2 chunks, 5 tokens
    assert r.tpot == pytest.approx((0.5 - 0.1) / 4)
    s = summarize([r])
    assert s["chunks_per_token"] == pytest.approx(2 / 5) and s["total_output_tokens"] == 5
