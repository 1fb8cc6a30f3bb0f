"""Aggregate metrics of a load-generator run, with vLLM's definitions.

Rules (``vllm bench serve``, ``vllm/benchmarks/serve.py:calculate_metrics``):
* TTFT = arrival of the first chunk carrying content; ITL = gaps between consecutive
  content chunks (vLLM's "ITL"); TPOT = (E2E - TTFT) / (output tokens - 1), output
  tokens from the server's ``usage`` (guidellm and AIPerf call this per-token figure
  "ITL"; both conventions are reported under ``naming``); E2E = until the response is
  complete. All from the request's intended send time (see ``records``).
* Percentiles interpolate linearly between order statistics (numpy's default); std is
  the population standard deviation (numpy's default).
* Throughput counts OUTPUT tokens only (``output_throughput``); ``total_token_throughput``
  adds prompt tokens. Rates divide by the run duration: first intended send to last
  completion.
* Goodput (DistServe): completed requests meeting every SLO given (TTFT, TPOT, E2E),
  per second of the same duration. A request with fewer than two output tokens has
  TPOT 0 for the goodput test, as in vLLM.
* Sessions: a session's E2E runs from its first call's intended start to its last
  call's end; a session succeeds when every call does. Tail amplification is observed,
  not assumed: a call is "in the tail" when its E2E exceeds the p95 of its own step's
  calls; we count sessions with at least one tail call next to 1 - 0.95^N.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import Field

from app.bench.records import ERROR_KINDS, RequestRecord
from app.schema import StrictFrozen
from app.stats import percentile

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)
NAMING = {
    "vllm": {"TTFT": "ttft", "ITL": "itl", "TPOT": "tpot", "E2EL": "e2e"},
    "guidellm_aiperf": {"TTFT": "ttft", "ITL": "tpot", "E2E": "e2e"},
    "note": (
        "vLLM's ITL is the gap between streamed chunks and its TPOT the per-token mean "
        "(E2E - TTFT) / (n - 1); guidellm and AIPerf report that per-token mean as ITL."
    ),
}


class SLO(StrictFrozen):
    """Per-request service levels (seconds) and the run-level error budget."""

    ttft_s: float | None = Field(default=None, gt=0)
    tpot_s: float | None = Field(default=None, gt=0)
    e2e_s: float | None = Field(default=None, gt=0)
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    p95_metric: str = Field(default="e2e", pattern="^(ttft|tpot|e2e)$")
    """Which latency the ramp compares with its SLO at p95."""

    @property
    def has_limits(self) -> bool:
        """Whether any per-request SLO is set (goodput is undefined otherwise)."""
        return any(x is not None for x in (self.ttft_s, self.tpot_s, self.e2e_s))

    def limit(self, metric: str) -> float | None:
        return {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2e": self.e2e_s}[metric]

    def good(self, record: RequestRecord) -> bool:
        if not record.ok:
            return False
        checks = (
            (self.ttft_s, record.ttft if record.ttft is not None else 0.0),
            (self.tpot_s, record.tpot if record.tpot is not None else 0.0),
            (self.e2e_s, record.e2e if record.e2e is not None else 0.0),
        )
        return all(limit >= value for limit, value in checks if limit is not None)


def pkey(q: float) -> str:
    """``p50``, ``p99``, ``p99.9``."""
    return f"p{q:g}"


def describe(values: Sequence[float]) -> dict[str, float | int | None]:
    """count, mean, std, p50/p90/p95/p99/p99.9 and max of ``values``."""
    out: dict[str, float | int | None] = {"count": len(values)}
    out["mean"] = statistics.fmean(values) if values else None
    out["std"] = statistics.pstdev(values) if values else None
    for q in PERCENTILES:
        out[pkey(q)] = percentile(values, q)
    out["max"] = max(values) if values else None
    return out


def duration(records: Sequence[RequestRecord]) -> float:
    """First intended send to last completion (or last send for unfinished requests)."""
    if not records:
        return 0.0
    start = min(r.intended for r in records)
    ends = [r.intended + (r.end if r.end is not None else max(r.lag, 0.0)) for r in records]
    return max(ends) - start


def summarize(
    records: Sequence[RequestRecord],
    slo: SLO | None = None,
    duration_s: float | None = None,
) -> dict[str, Any]:
    """Aggregates of ``records`` (callers pass the measured ones, warm-up excluded)."""
    dur = duration(records) if duration_s is None else duration_s
    if slo is not None and not slo.has_limits:
        slo = None
    ok = [r for r in records if r.ok]
    errors = Counter(r.error_kind for r in records if not r.ok)
    gen = [r for r in ok if r.endpoint != "embeddings"]
    ttfts = [r.ttft for r in gen if r.ttft is not None]
    tpots = [t for r in gen if (t := r.tpot) is not None]
    itls = [g for r in gen for g in r.itls()]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    out_tokens = sum(r.n_output for r in gen)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    good = sum(1 for r in ok if slo is not None and slo.good(r))
    per_s = (lambda x: x / dur) if dur > 0 else (lambda x: 0.0)
    return {
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "errors": {k: errors.get(k, 0) for k in ERROR_KINDS} | {"other": errors.get(None, 0)},
        "error_rate": (len(records) - len(ok)) / len(records) if records else 0.0,
        "duration_s": dur,
        "request_throughput": per_s(len(ok)),
        "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(out_tokens + in_tokens),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "goodput": per_s(good) if slo is not None else None,
        "good_requests": good if slo is not None else None,
        "ttft_s": describe(ttfts),
        "tpot_s": describe(tpots),
        "itl_s": describe(itls),
        "e2e_s": describe(e2es),
        "lag_s": describe([r.lag for r in records if not math.isnan(r.sent)]),
        "chunks_per_token": (sum(len(r.chunks) for r in gen) / out_tokens) if out_tokens else None,
        "cache_hit_rate": _cache_hit_rate(ok),
        "naming": NAMING,
    }


def _cache_hit_rate(ok: Iterable[RequestRecord]) -> float | None:
    reported = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    total = sum(r.prompt_tokens or 0 for r in reported)
    return sum(r.cached_tokens or 0 for r in reported) / total if total else None


def by_kind(
    records: Sequence[RequestRecord], slo: SLO | None, duration_s: float
) -> dict[str, dict[str, Any]]:
    """``summarize`` per workload class (rates over the whole run's duration)."""
    groups: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        groups[r.kind].append(r)
    return {k: summarize(v, slo, duration_s) for k, v in sorted(groups.items())}


def sessions(records: Sequence[RequestRecord], tail_q: float = 95.0) -> dict[str, Any] | None:
    """Session-level figures of chained calls (None when no record has a session)."""
    groups: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.session is not None:
            groups[r.session].append(r)
    if not groups:
        return None
    by_step: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.session is not None and r.e2e is not None:
            by_step[_step_key(r)].append(r.e2e)
    threshold = {k: percentile(v, tail_q) for k, v in by_step.items()}
    e2es, calls, tail_hits, predicted, ok_count = [], [], 0, [], 0
    share = tail_q / 100.0
    for calls_of in groups.values():
        calls_of.sort(key=lambda r: r.intended)
        calls.append(len(calls_of))
        predicted.append(1.0 - share ** len(calls_of))
        if all(r.ok for r in calls_of):
            ok_count += 1
            last = max(calls_of, key=lambda r: r.intended + (r.end or 0.0))
            e2es.append(last.intended + (last.end or 0.0) - calls_of[0].intended)
        if any(
            not r.ok or (r.e2e or 0.0) > (threshold.get(_step_key(r)) or math.inf) for r in calls_of
        ):
            tail_hits += 1
    return {
        "sessions": len(groups),
        "completed": ok_count,
        "calls_per_session": describe([float(c) for c in calls]),
        "session_e2e_s": describe(e2es),
        "tail_quantile": tail_q,
        "tail_threshold_s": threshold,
        "observed_tail_fraction": tail_hits / len(groups),
        "predicted_tail_fraction": statistics.fmean(predicted),
    }


def _step_key(record: RequestRecord) -> str:
    return record.kind
